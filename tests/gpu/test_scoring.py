"""The score models on the GPU in bfloat16, through CUDA graphs (token types in their static
buffer for the BERT cross-encoder): every pair's probability within 1e-2 of the float32
reference, in the reference's order up to ties closer than that."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from support import (
    classifier_logits,
    pair_ids,
    qwen3_reranker_prompts,
    qwen3_reranker_scores,
    save_cross_encoder,
    save_qwen3_reranker,
)

BOUND = 1e-2
QUERY = "What does a vector database store?"
DOCS = [f"Document {i}: " + "vectors and indexes " * (i % 40 + 1) for i in range(100)]


def in_order(got: np.ndarray, expected: np.ndarray) -> None:
    assert np.abs(got - expected).max() <= BOUND, np.abs(got - expected).max()
    order = np.argsort(-got, kind="stable")
    assert all(expected[a] >= expected[b] - BOUND for a, b in zip(order, order[1:], strict=False))


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_cross_encoders_in_bf16_match_float32(tmp_path: Path, family: str) -> None:
    folder = save_cross_encoder(tmp_path / family, family)
    engine = rose.Engine(folder, device="cuda", cuda_graphs="lazy")
    pairs = [pair_ids(folder, QUERY, d, engine.max_input_length) for d in DOCS]
    expected = 1 / (1 + np.exp(-classifier_logits(folder, pairs)[:, 0]))
    for _ in range(3):  # eager, capture, replay
        lengths = np.array([len(ids) for ids, _ in pairs])
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = np.concatenate([np.array(i, dtype=np.int32) for i, _ in pairs])
        types = np.concatenate([np.array(t, dtype=np.int32) for _, t in pairs])
        logits = engine.step(ids, cu, types if family == "bert" else None).wait()[:, 0]
        in_order(1 / (1 + np.exp(-logits)), expected)
    assert engine.fidelity["worst_cosine"] >= 0.999


def test_a_qwen3_reranker_in_bf16_matches_float32(tmp_path: Path) -> None:
    folder = save_qwen3_reranker(tmp_path / "qwen3-reranker")
    engine = rose.Engine(folder, device="cuda", task="score")
    rendered = qwen3_reranker_prompts(folder, QUERY, DOCS[:30])
    logits = engine.embed_ids(rendered)[:, 0]
    in_order(1 / (1 + np.exp(-logits)), qwen3_reranker_scores(folder, QUERY, DOCS[:30]))
    # The pairs' common head (template, instruction, query) ran once, with FlashInfer's kernels.
    assert engine.prefix_steps == 1 and engine._key_sharing_attention().name in ("fa3", "fa2")
    plain = rose.Engine(folder, device="cuda", task="score", shared_prefix=False).embed_ids(rendered)[:, 0]
    in_order(1 / (1 + np.exp(-logits)), 1 / (1 + np.exp(-plain)))
