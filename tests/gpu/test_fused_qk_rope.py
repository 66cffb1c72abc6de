"""The fused QK-norm and RoPE (quack's GEMM with ROSE's epilogue, rose.ops.fused_qk_rope) on a GPU
that runs it: the kernel against its arithmetic in float32 at the step sizes that take it and at
far positions, eager and replayed from a CUDA graph; its frequency table against quack's own; an
engine's large steps through it, within the fidelity bound of the float32 reference and beside the
unfused path, the graphs of large buckets captured again once it has loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import rose
from rose.ops import kernels
from rose.ops.fused_qk_rope import MIN_TOKENS, QkvShape, compile_for, interleaved_freq, qk_keep, reference
from rose.ops.large_steps import quack_unsupported
from support import (
    large_step_documents,
    qwen3_reranker_prompts,
    qwen3_reranker_scores,
    save_qwen3,
    save_qwen3_reranker,
    through_a_loaded_kernel,
    through_a_refused_kernel,
)

GPU = torch.device("cuda")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or quack_unsupported(GPU, torch.bfloat16) is not None,
    reason="needs a GPU that runs quack's GEMMs (compute capability 9.x or 10.x) and quack-kernels",
)
QWEN3 = QkvShape(heads=16, kv_heads=8, head_dim=128, hidden=1024, eps=1e-6)  # Qwen3-0.6B


def test_the_frequencies_are_quacks_layout() -> None:
    from quack.epilogue.rotary import make_interleaved_inv_freq

    inv_freq = kernels.rope_inv_freq(QWEN3.head_dim, 1e6)
    ours = interleaved_freq(inv_freq, QWEN3)
    theirs = make_interleaved_inv_freq(inv_freq.double(), QWEN3.qk_rows, QWEN3.rows - QWEN3.qk_rows)
    torch.testing.assert_close(ours, theirs.float().cpu(), rtol=0, atol=0)


def test_the_kernel_matches_float32_eager_and_under_a_graph() -> None:
    fused = compile_for(QWEN3, torch.bfloat16, GPU)
    torch.manual_seed(0)
    weight = (torch.randn(QWEN3.rows, QWEN3.hidden, device="cuda") * QWEN3.hidden**-0.5).bfloat16()
    freq = interleaved_freq(kernels.rope_inv_freq(QWEN3.head_dim, 1e6).cuda(), QWEN3)
    norm, keep = 1 + 0.1 * torch.randn(QWEN3.rows, device="cuda"), qk_keep(QWEN3, GPU)
    for tokens in (MIN_TOKENS, MIN_TOKENS + 64, 16384):
        x = torch.randn(tokens, QWEN3.hidden, device="cuda", dtype=torch.bfloat16)
        positions = torch.randint(0, 32768, (tokens,), device="cuda").float()
        want = reference(x, weight, positions, freq, norm, keep, QWEN3)
        got = fused(x, weight, positions, freq, norm, keep).float()
        error = float((got - want).norm() / want.norm())
        assert error < 1e-2, (tokens, error)
        per_row = torch.nn.functional.cosine_similarity(got.unflatten(1, (-1, 128)), want.unflatten(1, (-1, 128)), -1)
        assert per_row.min() > 0.999, (tokens, float(per_row.min()))
    args = (x, weight, positions, freq, norm, keep)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        captured = fused(*args)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.randn_like(x))
    positions.copy_(torch.randint_like(positions, 0, 512))
    graph.replay()
    torch.testing.assert_close(captured, fused(*args), rtol=0, atol=0)


def count_calls(engine: rose.Engine, calls: list[int]) -> None:
    """Wraps the engine's fused product so that each call appends its token count to `calls`."""
    product = engine.model.fused_qkv.product
    engine.model.fused_qkv.product = lambda x, *args: calls.append(len(x)) or product(x, *args)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
def test_an_engine_takes_it_for_large_steps_within_the_bound(tmp_path: Path, bidirectional: bool) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=bidirectional)
    docs = large_step_documents()
    engine = rose.Engine(folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_swiglu="off")
    calls = []

    def count() -> None:
        info = engine.stats()["fused_qk_rope"]
        assert info["weight_copy_bytes"] == 2 * QWEN3.rows * QWEN3.hidden * 2  # two layers' QKV in bf16
        count_calls(engine, calls)

    through_a_loaded_kernel(engine, engine.qk_rope, docs, count)
    assert calls == [calls[0]] * 2 and calls[0] >= MIN_TOKENS  # each layer's in the capture, none on replay

    off = rose.Engine(folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_qk_rope="off")
    off.embed_ids(docs)
    assert off.qk_rope.state == "off" and off.model.fused_qkv is None


def test_an_engine_refuses_a_kernel_that_fails_the_fidelity_check(tmp_path: Path) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=False)
    docs = large_step_documents()
    engine = rose.Engine(folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_swiglu="off")
    # A "kernel" whose q, k and v are all 0: attention adds nothing to any token.
    fake = lambda x, weight, *vectors: x.new_zeros(len(x), len(weight))  # noqa: E731
    through_a_refused_kernel(engine, engine.qk_rope, docs, fake)
    assert engine.model.fused_qkv is None


def test_a_qwen3_reranker_takes_it_on_its_shared_prefix_steps(tmp_path: Path) -> None:
    """A large score step whose pairs share the prompt's head: the head as a sequence of its own,
    the rest attending to its keys, all from the fused product; scores within 1e-2 of float32."""
    query = "What does a vector database store?"
    docs = [f"Document {i}: " + "vectors and indexes " * (i % 40 + 1) for i in range(100)]
    # Scores of 0.35-0.76; transformers' bfloat16 on the CPU strays 0.004 from float32 at this scale,
    # 0.028 at the default 5 (the engine's 0.037 failed the bound).
    folder = save_qwen3_reranker(tmp_path / "qwen3-reranker", "0.6b-2l", logit_scale=0.6)
    engine = rose.Engine(folder, device="cuda", task="score", fused_swiglu="off")
    rendered = qwen3_reranker_prompts(folder, query, docs)
    assert sum(map(len, rendered)) >= MIN_TOKENS
    unfused = engine.embed_ids(rendered)[:, 0]  # starts the loading
    engine.qk_rope.wait()
    engine.embed_ids(rendered)  # handed over
    assert engine.qk_rope.state == "ready", engine.qk_rope.describe()
    calls: list[int] = []
    count_calls(engine, calls)
    steps = engine.prefix_steps
    fused = engine.embed_ids(rendered)[:, 0]
    assert engine.prefix_steps > steps and calls and min(calls) >= MIN_TOKENS
    expected = qwen3_reranker_scores(folder, query, docs)
    for logits in (unfused, fused):
        scores = 1 / (1 + np.exp(-logits))
        assert np.abs(scores - expected).max() <= 1e-2
        order = np.argsort(-scores, kind="stable")
        assert all(expected[a] >= expected[b] - 1e-2 for a, b in zip(order, order[1:], strict=False))
