"""SwiGLU in the gate/up product's epilogue: quack's `gemm_gated` (a CuTe DSL GEMM; quack-kernels
comes with flash-attn-4) writes silu(gate) * up straight from its accumulators, where cuBLAS
writes both halves and ROSE's activation kernel reads them back. It pays on large steps only
(`benches/swiglu_gemm.py` sweeps the sizes), and quack takes seconds to import and compile, so an
engine loads it on a thread when the first large step comes: queries and the first answer never
wait for it. Once it is there the engine's fidelity check runs a large step with it
(rose.serving.startup.Startup.check_large), and the graphs of large steps are captured again."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from concurrent.futures import Future

import torch

from rose.runtime.background import in_background

log = logging.getLogger(__name__)

MODES = ("auto", "off")

MIN_TOKENS = 4096
"""The smallest step (in padded tokens) that takes the fused product: at 2,048 tokens cuBLAS and
the activation kernel were faster, from 4,096 the fused one (benches/swiglu_gemm.py)."""

MAX_ERROR = 2e-2
"""The largest relative error (Frobenius, against float32) the compiled kernel may show on random
inputs before it is used; a wrong gate/up layout gives errors of order one, bf16 rounding ~3e-3."""

GatedProduct = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(x [tokens, hidden], weight [2 * intermediate, hidden], gate rows first) -> silu(gate) * up."""


def why_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the fused product cannot run on `device` in `dtype`; None where it can."""
    if device.type != "cuda":
        return "not a CUDA device"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"{dtype} activations (it runs in 16 bits)"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10):  # quack's SM90 and SM100 GEMMs
        return f"compute capability {major}.{minor} (quack's gated GEMM runs on 9.x and 10.x)"
    if importlib.util.find_spec("quack") is None:
        return "quack-kernels is not installed (it comes with flash-attn-4)"
    return None


def compile_for(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> GatedProduct:
    """quack's gated GEMM for weights of `shape` [2 * intermediate, hidden], imported, compiled
    (the token count is dynamic: one compile serves every step) and checked against float32 on
    random inputs. Blocking; runs on a stream of its own, so a thread may call it while the
    engine's thread runs or captures steps."""
    from quack.gemm_interface import gemm_gated

    def fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # concat_layout: the weight's gate rows, then its up rows (ROSE's fused layout), read as is.
        _, out = gemm_gated(x, weight.t(), activation="swiglu", store_preact=False, tuned=False, concat_layout=("B",))
        return out

    with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)), torch.inference_mode():
        generator = torch.Generator(device).manual_seed(0)
        x = torch.randn(MIN_TOKENS, shape[1], device=device, dtype=dtype, generator=generator)
        weight = torch.randn(shape, device=device, dtype=dtype, generator=generator) * shape[1] ** -0.5
        got = fused(x, weight).float()
        gate, up = (x.float() @ weight.float().t()).chunk(2, dim=-1)
        want = torch.nn.functional.silu(gate) * up
        error = float((got - want).norm() / want.norm())
    if not error <= MAX_ERROR:
        raise RuntimeError(f"quack's gated GEMM is {error:.2e} off float32 (more than {MAX_ERROR})")
    log.info("quack's gated GEMM compiled for %s x %s (relative error %.1e)", *shape, error)
    return fused


class FusedSwiglu:
    """One engine's fused SwiGLU and where it stands: off, unsupported, waiting for a large step,
    loading, ready, or failed (the unfused path serves in every state but ready)."""

    def __init__(
        self,
        mode: str,
        shape: tuple[int, int] | None,
        dtype: torch.dtype,
        device: torch.device,
        load: Callable[[tuple[int, int], torch.dtype, torch.device], GatedProduct] = compile_for,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"fused SwiGLU must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.kernel: GatedProduct | None = None
        self.why: str | None = None
        self._args = (shape, dtype, device)
        self._load = load
        self._loading: Future[GatedProduct] | None = None
        if mode == "off":
            self.state = "off"
        elif shape is None:
            self.state, self.why = "unsupported", "the model has no 16-bit SwiGLU product"
        else:
            self.why = why_unsupported(device, dtype)
            self.state = "waiting" if self.why is None else "unsupported"

    def before_step(self, tokens: int) -> bool:
        """Called before each step of `tokens`: the first large one starts the loading. True once,
        when the kernel has just become ready (graphs of large steps must be captured again)."""
        if self.state == "waiting" and tokens >= MIN_TOKENS:
            self.start()
        if self.state != "loading" or not self._loading.done():
            return False
        loading, self._loading = self._loading, None
        try:
            self.kernel = loading.result()
        except Exception as why:  # noqa: BLE001 - the unfused path keeps serving
            self.state, self.why = "failed", str(why)
            log.warning("the fused SwiGLU is not used: %s", why)
            return False
        self.state = "ready"
        return True

    def reject(self, why: str) -> None:
        """Marks a loaded kernel as not served (the engine's fidelity check of it failed)."""
        self.kernel, self.state, self.why = None, "failed", why
        log.warning("the fused SwiGLU is not used: %s", why)

    def start(self) -> None:
        """Starts loading on a thread of its own (no-op unless waiting)."""
        if self.state != "waiting":
            return
        self.state = "loading"
        self._loading = in_background(lambda: self._load(*self._args), name="rose-swiglu")
        log.info("loading the fused SwiGLU (quack's gated GEMM) in the background")

    def wait(self) -> None:
        """Starts loading if waiting and blocks until it has finished (benchmarks)."""
        self.start()
        if self._loading is not None:
            self._loading.exception()

    def describe(self) -> dict[str, object]:
        """For /info."""
        return {"mode": self.mode, "state": self.state, "min_tokens": MIN_TOKENS, "why": self.why}
