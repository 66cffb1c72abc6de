"""The fused SwiGLU (quack's gated GEMM, rose.ops.fused_swiglu) on a GPU that runs it: the kernel
against float32 at the step sizes that take it, eager and replayed from a CUDA graph; an engine's
large steps through it, within the fidelity bound of the float32 reference and beside the unfused
path, the graphs of large buckets captured again once it has loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rose
from rose.ops import kernels
from rose.ops.fused_swiglu import MIN_TOKENS, compile_for
from rose.ops.large_steps import quack_unsupported
from support import large_step_documents, save_qwen3, through_a_loaded_kernel, through_a_refused_kernel

GPU = torch.device("cuda")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or quack_unsupported(GPU, torch.bfloat16) is not None,
    reason="needs a GPU that runs quack's gated GEMM (compute capability 9.x or 10.x) and quack-kernels",
)


def test_the_kernel_matches_float32_eager_and_under_a_graph() -> None:
    shape = (6144, 1024)  # Qwen3-0.6B's gate/up weight
    fused = compile_for(shape, torch.bfloat16, GPU)
    torch.manual_seed(0)
    weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 0.03
    for tokens in (MIN_TOKENS, MIN_TOKENS + 64, 16384):
        x = torch.randn(tokens, shape[1], device="cuda", dtype=torch.bfloat16)
        gate, up = (x.float() @ weight.float().t()).chunk(2, dim=-1)
        want = torch.nn.functional.silu(gate) * up
        got = fused(x, weight).float()
        unfused = kernels.silu_and_mul(x @ weight.t()).float()
        error, unfused_error = ((t - want).norm() / want.norm() for t in (got, unfused))
        assert error < 1e-2 and error <= 2 * unfused_error, (tokens, float(error), float(unfused_error))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        captured = fused(x, weight)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(captured, fused(x, weight), rtol=0, atol=0)


def test_an_engine_takes_it_for_large_steps_within_the_bound(tmp_path: Path) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=False)
    docs = large_step_documents()
    engine = rose.Engine(folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_qk_rope="off")
    calls = []

    def count() -> None:
        kernel = engine.model.fused_swiglu
        engine.model.fused_swiglu = lambda x, w: calls.append(len(x)) or kernel(x, w)

    through_a_loaded_kernel(engine, engine.swiglu, docs, count)
    # The first layer's step in the capture, none on replay; last-token pooling runs the last
    # layer's MLP on the pooled rows alone, too few for the kernel (rose.models.pooling).
    assert len(calls) == 1 and calls[0] >= MIN_TOKENS

    off = rose.Engine(
        folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_swiglu="off", fused_qk_rope="off"
    )
    off.embed_ids(docs)
    assert off.swiglu.state == "off" and off.model.fused_swiglu is None


def test_an_engine_refuses_a_kernel_that_fails_the_fidelity_check(tmp_path: Path) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=False)
    docs = large_step_documents()
    engine = rose.Engine(folder, device="cuda", dtype="bfloat16", max_batch_tokens=32768, fused_qk_rope="off")
    # A "kernel" whose activations are all 3: every token gets the same added vector.
    fake = lambda x, w: x.new_full((len(x), w.shape[0] // 2), 3.0)  # noqa: E731
    through_a_refused_kernel(engine, engine.swiglu, docs, fake)
    assert engine.model.fused_swiglu is None
