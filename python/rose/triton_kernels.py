"""Triton versions of the decoder's norm, RoPE and activation kernels, for GPUs without
FlashInfer and for head dims where FlashInfer's RoPE is wrong (16 on the H200).
Arithmetic in float32 inside, the model's dtype outside, as the torch reference in kernels.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, residual_ptr, weight_ptr, out_ptr, dim, eps, ADD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    if ADD:
        total = (x.to(tl.float32) + tl.load(residual_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)).to(
            x.dtype
        )
        tl.store(residual_ptr + row * dim + cols, total, mask=mask)
        h = total.to(tl.float32)
    else:
        h = x.to(tl.float32)
    normed = (h * tl.rsqrt(tl.sum(h * h, axis=0) / dim + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * dim + cols, (weight.to(tl.float32) * normed.to(tl.float32)).to(x.dtype), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (x may be a view, such as q out of the fused projection)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _rmsnorm[(x.numel() // dim,)](x, x, weight, out, dim, eps, ADD=False, BLOCK=triton.next_power_of_2(dim))
    return out


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x, then x = RMSNorm(residual), in place (FlashInfer's fused_add_rmsnorm);
    returns x."""
    assert x.is_contiguous() and residual.is_contiguous()
    dim = x.shape[-1]
    _rmsnorm[(x.numel() // dim,)](x, residual, weight, x, dim, eps, ADD=True, BLOCK=triton.next_power_of_2(dim))
    return x


@triton.jit
def _silu_and_mul(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    tl.store(out_ptr + row * width + cols, (g / (1.0 + tl.exp(-g)) * up).to(gate.dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times its second half."""
    x = x.contiguous()
    width = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(width))
    _silu_and_mul[(x.numel() // x.shape[-1], triton.cdiv(width, block))](x, out, width, BLOCK=block)
    return out


@triton.jit
def _rope(t_ptr, positions_ptr, cache_ptr, heads, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, HALF)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + position * 2 * HALF + i)
    sin = tl.load(cache_ptr + position * 2 * HALF + HALF + i)
    base = t_ptr + (token * heads + head) * 2 * HALF
    first = tl.load(base + i)
    x1, x2 = first.to(tl.float32), tl.load(base + HALF + i).to(tl.float32)
    tl.store(base + i, (x1 * cos - x2 * sin).to(first.dtype))
    tl.store(base + HALF + i, (x2 * cos + x1 * sin).to(first.dtype))


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
    """Rotates contiguous q [tokens, heads, dim] and k [tokens, kv_heads, dim] in place (NeoX
    halves) by each token's position; `cache` is [positions, dim] float32, cos then sin."""
    assert q.is_contiguous() and k.is_contiguous()
    half = q.shape[-1] // 2
    for t in (q, k):
        _rope[(t.shape[0], t.shape[1])](t, positions, cache, t.shape[1], HALF=half)
