"""XLM-RoBERTa (and RoBERTa): BERT's encoder with positions that start after the padding id, and
its sequence-classification head (the bge-reranker kind: dense, tanh, out_proj on <s>). The same
encoder serves XLM-R embedding models (BGE-M3's dense vector, multilingual-e5)."""

from __future__ import annotations

import torch

from rose.models.bert import Bert
from rose.models.heads import TanhClassifier


class XlmRoberta(Bert):
    """XLMRobertaModel's encoder."""

    weight_prefixes = ("roberta.", "model.")

    def __init__(self, config: dict, *args: object, **kwargs: object) -> None:
        super().__init__(config, *args, **kwargs)
        # Position ids start at padding_idx + 1 (the reference's create_position_ids_from_input_ids).
        self.position_offset = int(config.get("pad_token_id", 1)) + 1

    @staticmethod
    def score_head(weights: dict[str, torch.Tensor], tokenizer: object, config: dict) -> TanhClassifier:
        """XLMRobertaForSequenceClassification's classification head."""
        return TanhClassifier(
            weights["classifier.dense.weight"], weights["classifier.dense.bias"],
            weights["classifier.out_proj.weight"], weights["classifier.out_proj.bias"],
        )  # fmt: skip
