"""FP8 matmuls (`--dtype fp8`): e4m3 weights with one scale per output channel, made at load from
the 16-bit checkpoint; activations quantized per token as they enter each matmul; the products
through torch._scaled_mm (cuBLAS' and CUTLASS' FP8 GEMMs, compute capability 8.9 and later),
elsewhere through an emulation with the same rounding, so that the CPU's tests run the same
arithmetic. Norms, attention and everything between the matmuls stay 16-bit."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
"""e4m3's largest value (448): a row's largest magnitude is scaled to it."""

ALIGNMENT = 16
"""torch._scaled_mm wants both dimensions of the weight divisible by this."""


def supported(device: torch.device) -> bool:
    """Whether `device` multiplies FP8 natively (Ada and Hopper onwards)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (e4m3 [out, in], float32 scales [1, out]): one scale per output channel."""
    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale.t().contiguous()


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[tokens, k] -> (e4m3 [tokens, k], float32 scales [tokens, 1]): one scale per token."""
    h = x.float()
    scale = h.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (h / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows_reference, in one Triton pass on the GPU (a read of x, a write of a byte an
    element), where torch's ops would read and write the activations several times."""
    kernels = _triton() if x.is_cuda else None
    return kernels.quantize_rows(x) if kernels else quantize_rows_reference(x)


@functools.cache
def _triton() -> Any:
    try:
        from rose.ops import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def scaled_mm(
    xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """(xq * x_scale) @ (wq * w_scale^T)^T + bias in `out_dtype`, accumulated in float32."""
    if xq.is_cuda:
        # Row-wise scales need a 16-bit output; use_fast_accum is what FP8 serving stacks run
        # (the start-up fidelity check judges the result).
        return torch._scaled_mm(
            xq, wq.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=out_dtype, use_fast_accum=True
        )
    y = (xq.float() * x_scale) @ (wq.float() * w_scale.t()).t()
    return (y if bias is None else y + bias.float()).to(out_dtype)


class Fp8Linear:
    """A dense layer whose matmul runs in FP8. It keeps the 16-bit weight too: the fused
    single-query decoders read it (a single query is bound by reading weights and launching
    kernels, not by the matmul rate), and a failed fidelity check falls back to it
    (`enabled = False`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.weight = weight.to(dtype).contiguous()
        self.bias = None if bias is None else bias.to(dtype).contiguous()
        self.dtype = dtype
        out_features, in_features = weight.shape
        self.enabled = out_features % ALIGNMENT == 0 and in_features % ALIGNMENT == 0
        self.qweight, self.scale = quantize_weight(weight) if self.enabled else (None, None)

    @property
    def plain(self) -> bool:
        """Whether the matmul runs in 16 bits (FP8 off for this layer, or after a fallback)."""
        return not self.enabled

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled or x.numel() == 0:
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        xq, x_scale = quantize_rows(x.reshape(-1, x.shape[-1]))
        y = scaled_mm(xq, x_scale, self.qweight, self.scale, self.bias, self.dtype)
        return y.reshape(*lead, y.shape[-1])


def fp8_layers(model: object) -> list[Fp8Linear]:
    """Every Fp8Linear reachable from `model`'s attributes (layers are plain objects and lists)."""
    found: list[Fp8Linear] = []
    seen: set[int] = set()

    def visit(obj: object) -> None:
        if id(obj) in seen or isinstance(obj, (torch.Tensor, str, int, float, bool, type(None))):
            return
        seen.add(id(obj))
        if isinstance(obj, Fp8Linear):
            found.append(obj)
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item)
        elif hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                visit(item)

    visit(model)
    return found
