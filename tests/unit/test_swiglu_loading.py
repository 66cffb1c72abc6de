"""The fused SwiGLU's life in an engine (rose.ops.fused_swiglu.FusedSwiglu): loaded on a thread
only once a large step comes, handed over exactly once, and never used after a failed load. The
kernel itself is checked on the GPU (tests/gpu/test_fused_swiglu.py); here a loader stands in."""

from __future__ import annotations

import threading

import pytest
import torch

from rose.ops.fused_swiglu import MIN_TOKENS, FusedSwiglu, why_unsupported

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

    def __call__(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> object:
        self.calls += 1
        assert (shape, dtype, device) == (SHAPE, torch.bfloat16, GPU)
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        return product


def waiting(loader: Loader) -> FusedSwiglu:
    """A FusedSwiglu past the device checks (as on a Hopper GPU with quack installed)."""
    swiglu = FusedSwiglu("auto", SHAPE, torch.bfloat16, torch.device("cpu"), load=loader)
    swiglu.state, swiglu.why, swiglu._args = "waiting", None, (SHAPE, torch.bfloat16, GPU)
    return swiglu


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
    off = FusedSwiglu("off", SHAPE, torch.bfloat16, GPU, load=loader)
    cpu = FusedSwiglu("auto", SHAPE, torch.bfloat16, torch.device("cpu"), load=loader)
    none = FusedSwiglu("auto", None, torch.bfloat16, GPU, load=loader)
    for swiglu in (off, cpu, none):
        swiglu.wait()
        assert not swiglu.before_step(MIN_TOKENS * 2)
        assert swiglu.kernel is None
    assert loader.calls == 0
    assert (off.state, cpu.state, none.state) == ("off", "unsupported", "unsupported")
    assert cpu.why == "not a CUDA device"
    with pytest.raises(ValueError, match="auto, off"):
        FusedSwiglu("on", SHAPE, torch.bfloat16, GPU)


def test_float32_is_not_fused() -> None:
    assert why_unsupported(torch.device("cpu"), torch.bfloat16) == "not a CUDA device"
    assert "16 bits" in why_unsupported(GPU, torch.float32)
