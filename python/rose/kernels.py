"""Fused kernels of the decoder models: FlashInfer's on the GPU, Triton's inside CUDA graph
capture (or without FlashInfer), plain torch elsewhere (the CPU, or a GPU without either). The torch versions follow
Hugging Face's arithmetic (float32 inside, the model's dtype outside) and are the reference the
others are tested against."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from types import ModuleType

import torch
import torch.nn.functional as F

# Programmatic dependent launch for FlashInfer's kernels: None lets FlashInfer decide (on for
# Hopper and later), False turns it off.
ENABLE_PDL: bool | None = None

_graph_path = threading.local()


@contextlib.contextmanager
def for_graphs() -> Iterator[None]:
    """Selects the kernels that CUDA graphs capture (Triton's) on this thread, for a bucket's eager
    first run as well as its capture: the eager run then compiles and loads them, so that nothing
    is compiled while a graph is being captured, and its output is the one replays give."""
    previous = getattr(_graph_path, "on", False)
    _graph_path.on = True
    try:
        yield
    finally:
        _graph_path.on = previous


def _graph_kernels() -> bool:
    return getattr(_graph_path, "on", False) or torch.cuda.is_current_stream_capturing()


@functools.cache
def flashinfer() -> ModuleType | None:
    """FlashInfer, when it imports."""
    try:
        import flashinfer as module
    except ImportError:
        return None
    return module


@functools.cache
def triton_kernels() -> ModuleType | None:
    """ROSE's Triton kernels, when Triton imports."""
    try:
        from rose import triton_kernels as module
    except ImportError:
        return None
    return module


def _fast(x: torch.Tensor) -> ModuleType | None:
    """FlashInfer, for 16-bit x on the GPU off the CUDA graph path."""
    # FlashInfer's norm, RoPE and activation kernels run eagerly only: captured into a CUDA graph
    # on the H200 they replayed wrong results (benches/diag/graphs_qwen3.py). Its RoPE has no
    # float32 kernel (the fidelity check's reference runs in float32).
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16) or _graph_kernels():
        return None
    return flashinfer()


def _captured(x: torch.Tensor) -> ModuleType | None:
    """The Triton kernels on the GPU where FlashInfer's are not used: on the CUDA graph path, or
    without FlashInfer."""
    if not x.is_cuda or (flashinfer() is not None and not _graph_kernels()):
        return None
    return triton_kernels()


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; x is [tokens, dim] or [tokens, heads, dim] (QK-norm)."""
    fi, tr = _fast(x), _captured(x)
    if fi is not None:
        return fi.norm.rmsnorm(x, weight, eps, enable_pdl=ENABLE_PDL)
    if tr is not None:
        return tr.rmsnorm(x, weight, eps)
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x, then returns RMSNorm(residual). Both tensors may be overwritten."""
    fi, tr = _fast(x), _captured(x)
    if fi is not None:
        fi.norm.fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=ENABLE_PDL)
        return x
    if tr is not None:
        return tr.add_rmsnorm(x, residual, weight, eps)
    residual.add_(x)
    return rmsnorm(residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times its second half."""
    fi, tr = _fast(x), _captured(x)
    if fi is not None:
        return fi.activation.silu_and_mul(x, enable_pdl=ENABLE_PDL)
    if tr is not None:
        return tr.silu_and_mul(x)
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
    fi, tr = _fast(q), _captured(q)
    head_dim = q.shape[-1]
    if fi is not None:
        fi.rope.apply_rope_with_cos_sin_cache_inplace(
            positions, q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, cache, is_neox=True
        )
        return
    if tr is not None:
        tr.apply_rope(q, k, positions, cache)
        return
    cos, sin = cache[positions.long()].chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1)[:, None, :], torch.cat([sin, sin], -1)[:, None, :]
    for t in (q, k):
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        t.copy_((t.float() * cos + rotated.float() * sin).to(t.dtype))
