"""The life of a kernel for large steps in an engine (rose.ops.large_steps.LargeStepKernel: the fused
SwiGLU, the fused QK-norm and RoPE): loaded on a thread only once a large step comes, handed over
exactly once, and never used after a failed load; and where each cannot run. The kernels themselves
are checked on the GPU (tests/gpu/test_fused_swiglu.py, test_fused_qk_rope.py); here a loader stands
in."""

from __future__ import annotations

import threading

import pytest
import torch

from rose.ops.fused_qk_rope import QkvShape, qk_rope_kernel
from rose.ops.fused_swiglu import swiglu_kernel
from rose.ops.large_steps import LargeStepKernel, quack_unsupported

MIN_TOKENS = 4096
SHAPE = (6144, 1024)
GPU = torch.device("cuda")


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x


class Loader:
    """Counts its calls; returns `product` once released (or raises `error`)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self.error = error
        self.release = threading.Event()

    def __call__(self, *args: object) -> object:
        self.calls += 1
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        return product


def waiting(loader: Loader) -> LargeStepKernel:
    """A kernel past the device checks (as on a Hopper GPU with quack installed)."""
    return LargeStepKernel("fused SwiGLU", "auto", MIN_TOKENS, lambda: None, loader)


def test_it_loads_on_the_first_large_step_and_is_handed_over_once() -> None:
    loader = Loader()
    swiglu = waiting(loader)
    for _ in range(3):
        assert not swiglu.before_step(MIN_TOKENS - 1)
    assert loader.calls == 0 and swiglu.state == "waiting"
    assert not swiglu.before_step(MIN_TOKENS)
    assert swiglu.state == "loading" and swiglu.kernel is None
    assert not swiglu.before_step(100)  # still loading: steps go on unfused
    loader.release.set()
    swiglu.wait()
    assert swiglu.before_step(100) and swiglu.kernel is product
    assert swiglu.describe()["state"] == "ready"
    assert not swiglu.before_step(MIN_TOKENS) and loader.calls == 1
    swiglu.reject("worst cosine 0.98 against float32 on large steps")  # the engine's check of it failed
    assert (swiglu.state, swiglu.kernel) == ("failed", None) and not swiglu.before_step(MIN_TOKENS)
    assert loader.calls == 1


def test_a_failed_load_leaves_the_unfused_path_serving() -> None:
    loader = Loader(RuntimeError("quack's gated GEMM is 1.00e+00 off float32"))
    swiglu = waiting(loader)
    swiglu.before_step(MIN_TOKENS)
    loader.release.set()
    swiglu.wait()
    assert not swiglu.before_step(MIN_TOKENS)
    assert swiglu.state == "failed" and swiglu.kernel is None and "off float32" in swiglu.why
    assert not swiglu.before_step(MIN_TOKENS) and loader.calls == 1


def test_off_and_unsupported_never_load() -> None:
    loader = Loader()
    qwen3 = QkvShape(16, 8, 128, 1024, 1e-6)
    kernels = {
        "off": swiglu_kernel("off", SHAPE, torch.bfloat16, GPU, load=loader),
        "cpu": swiglu_kernel("auto", SHAPE, torch.bfloat16, torch.device("cpu"), load=loader),
        "none": swiglu_kernel("auto", None, torch.bfloat16, GPU, load=loader),
        "qk off": qk_rope_kernel("off", qwen3, torch.bfloat16, GPU, load=loader),
        "qk none": qk_rope_kernel("auto", None, torch.bfloat16, GPU, load=loader),
        "qk 64": qk_rope_kernel("auto", QkvShape(16, 8, 64, 1024, 1e-6), torch.bfloat16, GPU, load=loader),
        "qk cpu": qk_rope_kernel("auto", qwen3, torch.bfloat16, torch.device("cpu"), load=loader),
    }
    for kernel in kernels.values():
        kernel.wait()
        assert not kernel.before_step(MIN_TOKENS * 2)
        assert kernel.kernel is None
    assert loader.calls == 0
    assert {name: k.state for name, k in kernels.items()} == {
        "off": "off", "cpu": "unsupported", "none": "unsupported", "qk off": "off", "qk none": "unsupported",
        "qk 64": "unsupported", "qk cpu": "unsupported",
    }  # fmt: skip
    assert kernels["cpu"].why == kernels["qk cpu"].why == "not a CUDA device"
    assert "no 16-bit QKV product with per-head QK-norm" in kernels["qk none"].why
    assert "heads of 64" in kernels["qk 64"].why
    with pytest.raises(ValueError, match="auto, off"):
        swiglu_kernel("on", SHAPE, torch.bfloat16, GPU)


def test_float32_is_not_fused() -> None:
    assert quack_unsupported(torch.device("cpu"), torch.bfloat16) == "not a CUDA device"
    assert "16 bits" in quack_unsupported(GPU, torch.float32)
