"""Qwen3 on the CPU in-process: both kinds (causal Qwen3-Embedding, bidirectional pplx-embed) in a
small shape against Hugging Face transformers in float32, and its torch kernels against
transformers' own (tests/e2e/test_qwen3_server.py serves it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import rose
from rose.ops import fused_qk_rope, kernels
from support import QWEN3_SEQUENCES as SEQUENCES
from support import cosines, qwen3_reranker_prompts, save_qwen3, save_qwen3_reranker, transformers_pooled


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("prefix, top_level_rope", [("", False), ("model.", True)], ids=["plain", "prefixed"])
def test_in_process_matches_transformers(tmp_path: Path, bidirectional: bool, prefix: str, top_level_rope: bool):
    ours_dir = save_qwen3(tmp_path / "ours", "tiny", bidirectional, prefix, top_level_rope)
    hf_dir = save_qwen3(tmp_path / "hf", "tiny", bidirectional)
    engine = rose.Engine(ours_dir, device="cpu")
    assert engine.pooling == ("mean" if bidirectional else "last")
    assert engine.model.attention_spec.causal is not bidirectional
    ours = engine.embed_ids(SEQUENCES)
    expected = transformers_pooled(hf_dir, SEQUENCES).numpy()
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-3)


def test_the_two_kinds_differ(tmp_path: Path) -> None:
    causal = rose.Engine(save_qwen3(tmp_path / "c", "tiny", False), device="cpu", pooling="mean")
    bidirectional = rose.Engine(save_qwen3(tmp_path / "b", "tiny", True), device="cpu")
    assert cosines(causal.embed_ids(SEQUENCES[:1]), bidirectional.embed_ids(SEQUENCES[:1])).max() < 0.999


def test_torch_kernels_follow_transformers() -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    torch.manual_seed(0)
    x = torch.randn(7, 3, 16)
    norm = Qwen3RMSNorm(16, eps=1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    torch.testing.assert_close(kernels.rmsnorm(x, norm.weight.data, 1e-6), norm(x))
    q, k = torch.randn(7, 4, 16), torch.randn(7, 2, 16)
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 5], dtype=torch.int32)
    cache = kernels.rope_cache(16, 64, 1e6, torch.device("cpu"))
    cos, sin = cache[positions.long()].chunk(2, -1)
    cos, sin = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    eq, ek = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    kernels.apply_rope(q, k, positions, cache)
    torch.testing.assert_close(q, eq[0].transpose(0, 1))
    torch.testing.assert_close(k, ek[0].transpose(0, 1))


def fused_stand_in(engine: rose.Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every step of `engine` through the fused QK-norm and RoPE's weight copies, per-column
    vectors and pair order (rose.ops.fused_qk_rope), with its arithmetic in torch standing in for
    quack's kernel (which tests/gpu/test_fused_qk_rope.py checks against the same arithmetic).
    Returns the list its calls' token counts go to."""
    shape, calls = engine.model.qkv_shape, []

    def stand_in(*args: torch.Tensor) -> torch.Tensor:
        calls.append(len(args[0]))
        return fused_qk_rope.reference(*args, shape).to(args[0].dtype)

    monkeypatch.setattr(fused_qk_rope, "MIN_TOKENS", 1)
    engine.model.use_fused_qkv(stand_in)
    return calls


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
def test_the_fused_qkv_layout_keeps_the_vectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bidirectional: bool):
    engine = rose.Engine(save_qwen3(tmp_path / "q", "tiny", bidirectional), device="cpu")
    unfused = engine.embed_ids(SEQUENCES)
    calls = fused_stand_in(engine, monkeypatch)
    fused = engine.embed_ids(SEQUENCES)
    assert len(calls) == engine.model_dir.config["num_hidden_layers"]
    assert cosines(fused, unfused).min() >= 0.99999
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-5)
    engine.model.use_fused_qkv(None)
    np.testing.assert_array_equal(engine.embed_ids(SEQUENCES), unfused)


def test_the_fused_qkv_layout_keeps_a_rerankers_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A score step whose pairs share the prompt's head: the head as a sequence of its own, the
    rest attending to its keys, both from the fused product's pair-ordered q and k."""
    folder = save_qwen3_reranker(tmp_path / "qwen3-reranker")
    engine = rose.Engine(folder, device="cpu", task="score")
    docs = [f"Document {i}: " + "vectors and indexes " * (i % 9 + 1) for i in range(12)]
    rendered = qwen3_reranker_prompts(folder, "What does a vector database store?", docs)
    unfused = engine.embed_ids(rendered)[:, 0]
    calls = fused_stand_in(engine, monkeypatch)
    steps = engine.prefix_steps
    fused = engine.embed_ids(rendered)[:, 0]
    assert engine.prefix_steps == steps + 1 and len(calls) == engine.model_dir.config["num_hidden_layers"]
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-4)
    assert np.ptp(unfused) > 1  # scores that differ, so that a lost position would show
