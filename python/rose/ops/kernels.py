"""Fused kernels of the decoder models: ROSE's Triton kernels on the GPU, FlashInfer's where
Triton is missing, plain torch elsewhere (the CPU, float32, or a GPU without either). The same
kernels run eagerly and inside CUDA graphs. The torch versions follow Hugging Face's arithmetic
(float32 inside, the model's dtype outside) and are the reference the others are tested against."""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

# Programmatic dependent launch for FlashInfer's kernels: None lets FlashInfer decide (on for
# Hopper and later), False turns it off.
ENABLE_PDL: bool | None = None

# Work folded into the matrix products' epilogues on a GPU in 16 bits (a decoder's residual adds,
# BERT's GELU): benches/step_breakdown.py turns it off to measure what it saves in the same start.
FUSED_EPILOGUES = True

# Head dims for FlashInfer's RoPE: at 16 it rotated half of q wrong; the GPU test
# (tests/gpu/test_backends.py::test_fused_kernels_match_the_torch_reference) checks 64 and 128.
_FLASHINFER_ROPE_DIMS = (64, 128, 256)


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
        from rose.ops import triton_kernels as module
    except ImportError:
        return None
    return module


def _gpu_16bit(x: torch.Tensor) -> bool:
    # The float32 runs (the fidelity check's reference) take the torch path.
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


def _flashinfer_for(x: torch.Tensor) -> ModuleType | None:
    """FlashInfer, for 16-bit x on the GPU."""
    return flashinfer() if _gpu_16bit(x) else None


def _triton_for(x: torch.Tensor) -> ModuleType | None:
    """ROSE's Triton kernels, for 16-bit x on the GPU."""
    return triton_kernels() if _gpu_16bit(x) else None


def fuses_epilogues(x: torch.Tensor) -> bool:
    """Whether x's matrix products take their residual add or activation in the epilogue."""
    return FUSED_EPILOGUES and _gpu_16bit(x)


# The norms are Triton's, not FlashInfer's: FlashInfer's CUDA norm module takes minutes of nvcc
# on a fresh machine (its whole norm family is one module), and its default CuTe DSL norms
# compile again in every process; Triton compiles one kernel in about a second and keeps it.


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; x is [tokens, dim] or [tokens, heads, dim] (QK-norm)."""
    tr = _triton_for(x)
    if tr is not None:
        return tr.rmsnorm(x, weight, eps)
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x, then returns RMSNorm(residual). Both tensors may be overwritten."""
    tr = _triton_for(x)
    if tr is not None:
        return tr.add_rmsnorm(x, residual, weight, eps)
    residual.add_(x)
    return rmsnorm(residual, weight, eps)


def add_layernorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual) over the last dimension (BERT's post-norm); x may be overwritten."""
    tr = _triton_for(x)
    if tr is not None and FUSED_EPILOGUES:
        return tr.add_layernorm(x, residual, weight, bias, eps)
    return F.layer_norm(x.add_(residual), (x.shape[-1],), weight, bias, eps)


# Triton's first: importing FlashInfer takes about a second (it loads the CuTe DSL), which the
# model's own kernels must not add to the first answer; only the attention backends that need
# FlashInfer import it, off the start-up path (rose.attention.AutoBackend).


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times its second half."""
    tr = _triton_for(x)
    if tr is not None:
        return tr.silu_and_mul(x)
    fi = _flashinfer_for(x)
    if fi is not None:
        return fi.activation.silu_and_mul(x, enable_pdl=ENABLE_PDL)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[head_dim / 2] float32: RoPE's angle per position of each rotated pair, as transformers
    computes it."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cache(head_dim: int, max_positions: int, theta: float, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of each position's angles, then their sin."""
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), rope_inv_freq(head_dim, theta))
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> None:
    """Rotates q [tokens, heads, dim] and k [tokens, kv_heads, dim] in place (NeoX halves), each
    token by its own position in its sequence."""
    head_dim = q.shape[-1]
    tr = _triton_for(q)
    if tr is not None:
        tr.apply_rope(q, k, positions, cache)
        return
    fi = _flashinfer_for(q) if head_dim in _FLASHINFER_ROPE_DIMS else None
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


def qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cache: torch.Tensor,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head RMSNorm of q and k, then RoPE, from the fused projection qkv
    [tokens, (heads + 2 kv_heads) * dim]; returns q [tokens, heads, dim] and k. On the GPU one
    Triton kernel does it all (one launch where there were three, which counts on short queries)."""
    head_dim = q_weight.shape[0]
    tr = _triton_for(qkv)
    if tr is not None and tr.fits_qk_norm_rope(head_dim):
        return tr.qk_norm_rope(qkv, q_weight, k_weight, eps, positions, cache, heads, kv_heads)
    q = rmsnorm(qkv[:, : heads * head_dim].reshape(-1, heads, head_dim), q_weight, eps)
    k = rmsnorm(qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(-1, kv_heads, head_dim), k_weight, eps)
    apply_rope(q, k, positions, cache)
    return q, k
