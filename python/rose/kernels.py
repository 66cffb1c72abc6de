"""Fused kernels of the decoder models: FlashInfer's on the GPU, plain torch elsewhere (the CPU,
or a GPU without FlashInfer). The torch versions follow Hugging Face's arithmetic (float32
inside, the model's dtype outside) and are the reference the FlashInfer ones are tested against."""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

# Programmatic dependent launch for FlashInfer's kernels: None lets FlashInfer decide (on for
# Hopper and later), False turns it off.
ENABLE_PDL: bool | None = None


@functools.cache
def flashinfer() -> ModuleType | None:
    """FlashInfer, when it imports."""
    try:
        import flashinfer as module
    except ImportError:
        return None
    return module


def _fast(x: torch.Tensor) -> ModuleType | None:
    # FlashInfer's norm, RoPE and activation kernels run eagerly only: captured into a CUDA graph
    # on the H200 they replayed wrong results (benches/diag/graphs_qwen3.py), so a graph gets the
    # torch versions, which the graph's single launch spares their launch overhead.
    if not x.is_cuda or torch.cuda.is_current_stream_capturing():
        return None
    return flashinfer()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; x is [tokens, dim] or [tokens, heads, dim] (QK-norm)."""
    fi = _fast(x)
    if fi is not None:
        return fi.norm.rmsnorm(x, weight, eps, enable_pdl=ENABLE_PDL)
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x, then returns RMSNorm(residual). Both tensors may be overwritten."""
    fi = _fast(x)
    if fi is not None:
        fi.norm.fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=ENABLE_PDL)
        return x
    residual.add_(x)
    return rmsnorm(residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times its second half."""
    fi = _fast(x)
    if fi is not None:
        return fi.activation.silu_and_mul(x, enable_pdl=ENABLE_PDL)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_cache(head_dim: int, max_positions: int, theta: float, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of each position's angles, then their sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
    """Rotates q [tokens, heads, dim] and k [tokens, kv_heads, dim] in place (NeoX halves), each
    token by its own position in its sequence."""
    fi = _fast(q)
    head_dim = q.shape[-1]
    if fi is not None:
        fi.rope.apply_rope_with_cos_sin_cache_inplace(
            positions, q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, cache, is_neox=True
        )
        return
    cos, sin = cache[positions.long()].chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]
    for t in (q, k):
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        t.copy_((t.float() * cos + rotated.float() * sin).to(t.dtype))
