"""What a model is served for: embedding ("embed"), or scoring sequences such as query-document
pairs ("score": a cross-encoder's classification head, or a causal reranker's yes/no logit), as
the folder says (`*ForSequenceClassification`) or as `--task score` asks (a Qwen3-Reranker is
published as a plain `Qwen3ForCausalLM`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rose.errors import ModelError
from rose.loading.model_dir import ModelDir

TASKS = ("auto", "embed", "score")

QWEN3_RERANKER_TEMPLATE = {
    "prefix": (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    ),
    "content": "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    "suffix": "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "default_instruction": "Given a web search query, retrieve relevant passages that answer the query",
}
"""How Qwen3-Reranker is published to be prompted: the pair rendered into `content` between a fixed
prefix and suffix (Ivy renders it; the document is what truncation shortens)."""


@dataclass
class Scoring:
    """A score model's head, labels, pooling and pair template (for Ivy)."""

    head: Any
    labels: list[str]
    pooling: str
    template: dict[str, Any] = field(default_factory=lambda: {"pair": "tokenizer"})


def resolve(
    requested: str, model_dir: ModelDir, family: type, weights: dict[str, torch.Tensor], instruction: str | None
) -> Scoring | None:
    """The scoring a model is served with, or None for an embedding model."""
    if requested not in TASKS:
        raise ModelError(f"--task must be one of {', '.join(TASKS)}, not {requested!r}")
    architectures = model_dir.config.get("architectures") or []
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    task = requested if requested != "auto" else "score" if classifier else "embed"
    if task == "embed":
        return None
    if not hasattr(family, "score_head"):
        raise ModelError(f"{model_dir.model_type} models cannot score here; use --task embed")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(model_dir.tokenizer_json().decode())
    try:
        head = family.score_head(weights, tokenizer, model_dir.config)
    except KeyError as missing:
        raise ModelError(f"{model_dir.path} has no score head ({missing} is missing); use --task embed") from None
    if classifier:
        names = model_dir.config.get("id2label") or {"0": "LABEL_0"}
        labels = [names[k] for k in sorted(names, key=int)]
        return Scoring(head, labels, getattr(head, "pooling", family.score_pooling))
    template = {
        **QWEN3_RERANKER_TEMPLATE,
        "default_instruction": instruction or QWEN3_RERANKER_TEMPLATE["default_instruction"],
    }
    return Scoring(head, ["relevance"], family.score_pooling, template)
