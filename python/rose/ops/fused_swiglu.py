"""SwiGLU in the gate/up product's epilogue: quack's `gemm_gated` (a CuTe DSL GEMM; quack-kernels
comes with flash-attn-4) writes silu(gate) * up straight from its accumulators, where cuBLAS
writes both halves and ROSE's activation kernel reads them back. It pays on large steps only
(`benches/swiglu_gemm.py` sweeps the sizes), so an engine loads it on a thread when the first large
step comes (rose.ops.large_steps); once it is there the engine's fidelity check runs a large step
with it (rose.serving.startup.Startup.check_large), and the graphs of large steps are captured
again."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from rose.ops.large_steps import LargeStepKernel, checked_error, quack_unsupported

log = logging.getLogger(__name__)

MIN_TOKENS = 4096
"""The smallest step (in padded tokens) that takes the fused product: at 2,048 tokens cuBLAS and
the activation kernel were faster, from 4,096 the fused one (benches/swiglu_gemm.py)."""

GatedProduct = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(x [tokens, hidden], weight [2 * intermediate, hidden], gate rows first) -> silu(gate) * up."""


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
        gate, up = (x.float() @ weight.float().t()).chunk(2, dim=-1)
        error = checked_error("quack's gated GEMM", fused(x, weight), torch.nn.functional.silu(gate) * up)
    log.info("quack's gated GEMM compiled for %s x %s (relative error %.1e)", *shape, error)
    return fused


def swiglu_kernel(
    mode: str,
    shape: tuple[int, int] | None,
    dtype: torch.dtype,
    device: torch.device,
    load: Callable[[tuple[int, int], torch.dtype, torch.device], GatedProduct] = compile_for,
) -> LargeStepKernel[GatedProduct]:
    """An engine's fused SwiGLU for a model whose gate/up weight has `shape` (None: no 16-bit
    SwiGLU product), in `mode` auto or off."""

    def why() -> str | None:
        return "the model has no 16-bit SwiGLU product" if shape is None else quack_unsupported(device, dtype)

    return LargeStepKernel("fused SwiGLU", mode, MIN_TOKENS, why, lambda: load(shape, dtype, device))
