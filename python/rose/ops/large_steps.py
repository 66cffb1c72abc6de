"""Kernels that only large steps take, loaded on a thread when the first large step comes: quack's
GEMMs with the work around a product in their epilogues (rose.ops.fused_swiglu,
rose.ops.fused_qk_rope). quack takes seconds to import and compile, so queries and the first answer
never wait for it; the unfused path serves every step until the kernel is ready, and again if it
fails to load or the engine's fidelity check refuses it."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

import torch

from rose.runtime.background import in_background

log = logging.getLogger(__name__)

MODES = ("auto", "off")

K = TypeVar("K")

MAX_ERROR = 2e-2
"""The largest relative error (Frobenius, against float32) a compiled kernel may show on random
inputs before it is used: bf16 rounding gives ~3e-3, a wrong layout errors of order one."""


def checked_error(what: str, got: torch.Tensor, want: torch.Tensor) -> float:
    """`got`'s relative error against `want` (float32), which a kernel's load checks before it
    is used; raises where it exceeds MAX_ERROR."""
    error = float((got.float() - want).norm() / want.norm())
    if not error <= MAX_ERROR:
        raise RuntimeError(f"{what} is {error:.2e} off float32 (more than {MAX_ERROR})")
    return error


def quack_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why quack's GEMMs cannot run on `device` in `dtype`; None where they can."""
    if device.type != "cuda":
        return "not a CUDA device"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"{dtype} activations (it runs in 16 bits)"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10):  # quack's SM90 and SM100 GEMMs
        return f"compute capability {major}.{minor} (quack's GEMMs with epilogues run on 9.x and 10.x)"
    if importlib.util.find_spec("quack") is None:
        return "quack-kernels is not installed (it comes with flash-attn-4)"
    return None


class LargeStepKernel(Generic[K]):
    """One engine's kernel for large steps and where it stands: off, unsupported, waiting for a
    large step, loading, ready, or failed (the unfused path serves in every state but ready)."""

    def __init__(
        self, name: str, mode: str, min_tokens: int, why: Callable[[], str | None], load: Callable[[], K]
    ) -> None:
        """`why` says why the kernel cannot run here (None where it can; asked unless off); `load`
        imports, compiles and checks it, blocking, on the loading thread."""
        if mode not in MODES:
            raise ValueError(f"the {name} must be one of {', '.join(MODES)}, not {mode!r}")
        self.name, self.mode, self.min_tokens = name, mode, min_tokens
        self.kernel: K | None = None
        self.why = None if mode == "off" else why()
        self.state = "off" if mode == "off" else ("unsupported" if self.why is not None else "waiting")
        self._load = load
        self._loading: Future[K] | None = None

    def before_step(self, tokens: int) -> bool:
        """Called before each step of `tokens`: the first large one starts the loading. True once,
        when the kernel has just become ready (graphs of large steps must be captured again)."""
        if self.state == "waiting" and tokens >= self.min_tokens:
            self.start()
        if self.state != "loading" or not self._loading.done():
            return False
        loading, self._loading = self._loading, None
        try:
            self.kernel = loading.result()
        except Exception as why:  # noqa: BLE001 - the unfused path keeps serving
            self.state, self.why = "failed", str(why)
            log.warning("the %s is not used: %s", self.name, why)
            return False
        self.state = "ready"
        return True

    def reject(self, why: str) -> None:
        """Marks a loaded kernel as not served (the engine's fidelity check of it failed)."""
        self.kernel, self.state, self.why = None, "failed", why
        log.warning("the %s is not used: %s", self.name, why)

    def start(self) -> None:
        """Starts loading on a thread of its own (no-op unless waiting)."""
        if self.state != "waiting":
            return
        self.state = "loading"
        self._loading = in_background(self._load, name=f"rose-{self.name.replace(' ', '-')}")
        log.info("loading the %s in the background", self.name)

    def wait(self) -> None:
        """Starts loading if waiting and blocks until it has finished (benchmarks, tests)."""
        self.start()
        if self._loading is not None:
            self._loading.exception()

    def describe(self) -> dict[str, object]:
        """For /info."""
        return {"mode": self.mode, "state": self.state, "min_tokens": self.min_tokens, "why": self.why}
