"""Triton versions of the decoder's norm, RoPE and activation kernels: the norms and Qwen3's
fused QK-norm and RoPE always, the others for GPUs without FlashInfer and for head dims where
FlashInfer's RoPE is wrong (16); and attention for small batches (the "triton"
attention backend).
Arithmetic in float32 inside, the model's dtype outside, as the torch reference in rose.ops.kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rose.ops.fp8 import FP8, FP8_MAX


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
def _add_layernorm(x_ptr, residual_ptr, weight_ptr, bias_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    h = x.to(tl.float32) + tl.load(residual_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(h, axis=0) / dim
    centred = tl.where(mask, h - mean, 0.0)
    normed = centred * tl.rsqrt(tl.sum(centred * centred, axis=0) / dim + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * dim + cols, (normed * weight + bias).to(x.dtype), mask=mask)


def add_layernorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """x = LayerNorm(x + residual), in place in one pass (the sum stays in float32); returns x."""
    assert x.is_contiguous() and residual.is_contiguous()
    dim = x.shape[-1]
    _add_layernorm[(x.numel() // dim,)](x, residual, weight, bias, dim, eps, BLOCK=triton.next_power_of_2(dim))
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


@triton.jit
def _norm_rope(rows, weight_ptr, cos, sin, eps, mask, HALF: tl.constexpr, CACHE: tl.constexpr):
    """RMSNorm of the head that starts at each of `rows` (pointers [R, 1]), then RoPE; returns its
    two rotated halves [R, HALF] in the input's dtype. CACHE: the loads' cache modifier ("" for
    the default; a defaulted constexpr argument does not compile)."""
    i = tl.arange(0, HALF)[None, :]
    first = tl.load(rows + i, mask=mask, other=0.0, cache_modifier=CACHE)
    a = first.to(tl.float32)
    b = tl.load(rows + HALF + i, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
    scale = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
    # Rounded where Hugging Face rounds: after the norm, after the weight, after the rotation.
    a = (tl.load(weight_ptr + i).to(tl.float32) * (a * scale).to(first.dtype).to(tl.float32)).to(first.dtype)
    b = (tl.load(weight_ptr + HALF + i).to(tl.float32) * (b * scale).to(first.dtype).to(tl.float32)).to(first.dtype)
    a, b = a.to(tl.float32), b.to(tl.float32)
    return (a * cos - b * sin).to(first.dtype), (b * cos + a * sin).to(first.dtype)


@triton.jit
def _norm_rope_heads(src, dst, weight_ptr, cos, sin, eps, H: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """RMSNorm of each of H heads at src (head after head), then RoPE; contiguous into dst."""
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, HALF)[None, :]
    mask = (h < H) & (i < HALF)
    a, b = _norm_rope(src + h * 2 * HALF, weight_ptr, cos, sin, eps, mask, HALF, "")
    tl.store(dst + h * 2 * HALF + i, a, mask=mask)
    tl.store(dst + h * 2 * HALF + HALF + i, b, mask=mask)


@triton.jit
def _qk_norm_rope(
    qkv_ptr, q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, positions_ptr, cache_ptr, row_stride, eps,
    HQ: tl.constexpr, HK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, HALF)[None, :]
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + position * 2 * HALF + i)
    sin = tl.load(cache_ptr + position * 2 * HALF + HALF + i)
    src = qkv_ptr + token * row_stride
    _norm_rope_heads(src, q_ptr + token * HQ * 2 * HALF, q_weight_ptr, cos, sin, eps, HQ, BLOCK_Q, HALF)
    src += HQ * 2 * HALF
    _norm_rope_heads(src, k_ptr + token * HK * 2 * HALF, k_weight_ptr, cos, sin, eps, HK, BLOCK_K, HALF)


def fits_qk_norm_rope(head_dim: int) -> bool:
    """Whether qk_norm_rope compiles for this head dim (half of it a power of two)."""
    return head_dim % 2 == 0 and triton.next_power_of_2(head_dim // 2) == head_dim // 2


def fits_norm_rope_attention(head_dim: int) -> bool:
    """Whether norm_rope_attention compiles for this head dim (its dot products need halves of 16)."""
    return fits_qk_norm_rope(head_dim) and head_dim >= 32


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
    """Qwen3's QK-norm and RoPE in one launch, from the fused projection qkv
    [tokens, (heads + 2 kv_heads) * dim] (rows may be strided); returns contiguous q
    [tokens, heads, dim] and k [tokens, kv_heads, dim]."""
    assert qkv.stride(1) == 1
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    q = torch.empty(tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope[(tokens,)](
        qkv, q, k, q_weight, k_weight, positions, cache, qkv.stride(0), eps,
        HQ=heads, HK=kv_heads, BLOCK_Q=triton.next_power_of_2(heads), BLOCK_K=triton.next_power_of_2(kv_heads),
        HALF=head_dim // 2,
    )  # fmt: skip
    return q, k


SMALL_BATCH_TOKENS = 64
"""The largest (padded) batch small_batch_attention takes: a head's whole score matrix sits in
registers."""


@triton.jit
def _attend(scores, t, valid, seq_ptr, v, CAUSAL: tl.constexpr):
    """Softmax of one head's scores [T, T], token i seeing token j when both are of the same
    sequence (and j <= i when causal), times v [T, D]."""
    seq_row = tl.load(seq_ptr + t, mask=valid, other=-1)
    seq_col = tl.load(seq_ptr + t, mask=valid, other=-2)
    seen = seq_row[:, None] == seq_col[None, :]
    if CAUSAL:
        seen = seen & (t[None, :] <= t[:, None])
    scores = tl.where(seen, scores, -1e30)  # finite: the padding rows see nothing and stay finite
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    return tl.dot(p.to(v.dtype), v)


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, seq_ptr, out_ptr, T, v_stride, scale,
    H: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """One head over every token of the batch."""
    head = tl.program_id(0)
    kv_head = head // (H // HK)
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)[None, :]
    valid = t < T
    q = tl.load(q_ptr + (t[:, None] * H + head) * D + d, mask=valid[:, None], other=0.0)
    k = tl.load(k_ptr + (t[:, None] * HK + kv_head) * D + d, mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + t[:, None] * v_stride + kv_head * D + d, mask=valid[:, None], other=0.0)
    out = _attend(tl.dot(q, tl.trans(k)) * scale, t, valid, seq_ptr, v, CAUSAL)
    tl.store(out_ptr + (t[:, None] * H + head) * D + d, out.to(v.dtype), mask=valid[:, None])


def small_batch_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_ids: torch.Tensor, causal: bool, scale: float
) -> torch.Tensor:
    """Attention over a packed batch of at most SMALL_BATCH_TOKENS tokens in one launch: q [T, H, D]
    and k [T, HK, D] contiguous, v [T, HK, D] with strided rows (a view into the fused
    projection); `seq_ids` [T] gives each token's sequence. Returns [T, H * D]."""
    tokens, heads, dim = q.shape
    assert tokens <= SMALL_BATCH_TOKENS and q.is_contiguous() and k.is_contiguous()
    assert v.stride(1) == dim and v.stride(2) == 1
    out = torch.empty(tokens, heads * dim, dtype=q.dtype, device=q.device)
    _attention_kernel[(heads,)](
        q, k, v, seq_ids, out, tokens, v.stride(0), scale,
        H=heads, HK=k.shape[1], D=dim, CAUSAL=causal,
        BLOCK_T=max(16, triton.next_power_of_2(tokens)), num_warps=4,
    )  # fmt: skip
    return out


@triton.jit
def norm_rope_attend(
    qkv_ptr, row_stride, head, T, q_weight_ptr, k_weight_ptr, positions_ptr, cache_ptr, seq_ptr, eps, scale,
    H: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_T: tl.constexpr,
    CACHE: tl.constexpr,
):  # fmt: skip
    """One head over every token of the batch, its q and k normed and rotated on the way in: the
    head's output [BLOCK_T, 2 * HALF] in float32. CACHE: the cache modifier of the qkv loads."""
    kv_head = head // (H // HK)
    t = tl.arange(0, BLOCK_T)
    i = tl.arange(0, HALF)[None, :]
    valid = t < T
    mask = valid[:, None] & (i < HALF)
    position = tl.load(positions_ptr + t, mask=valid, other=0).to(tl.int64)[:, None]
    cos = tl.load(cache_ptr + position * 2 * HALF + i)
    sin = tl.load(cache_ptr + position * 2 * HALF + HALF + i)
    rows = qkv_ptr + t[:, None].to(tl.int64) * row_stride
    q1, q2 = _norm_rope(rows + head * 2 * HALF, q_weight_ptr, cos, sin, eps, mask, HALF, CACHE)
    k1, k2 = _norm_rope(rows + (H + kv_head) * 2 * HALF, k_weight_ptr, cos, sin, eps, mask, HALF, CACHE)
    d = tl.arange(0, 2 * HALF)[None, :]
    v = tl.load(rows + (H + HK + kv_head) * 2 * HALF + d, mask=valid[:, None], other=0.0, cache_modifier=CACHE)
    # The rotated halves stay apart: q.k is the sum of the halves' dot products.
    scores = (tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))) * scale
    return _attend(scores, t, valid, seq_ptr, v, CAUSAL)


@triton.jit
def _norm_rope_attention_kernel(
    qkv_ptr, q_weight_ptr, k_weight_ptr, positions_ptr, cache_ptr, seq_ptr, out_ptr, T, row_stride, eps, scale,
    H: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """One program per head; the output rows are [T, H * 2 * HALF]."""
    head = tl.program_id(0)
    out = norm_rope_attend(qkv_ptr, row_stride, head, T, q_weight_ptr, k_weight_ptr, positions_ptr, cache_ptr,
                           seq_ptr, eps, scale, H, HK, HALF, CAUSAL, BLOCK_T, "")  # fmt: skip
    t = tl.arange(0, BLOCK_T)[:, None]
    d = tl.arange(0, 2 * HALF)[None, :]
    tl.store(out_ptr + (t * H + head) * 2 * HALF + d, out.to(out_ptr.dtype.element_ty), mask=t < T)


def norm_rope_attention(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    cache: torch.Tensor,
    seq_ids: torch.Tensor,
    heads: int,
    kv_heads: int,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """qk_norm_rope and small_batch_attention in one launch, for a packed batch of at most
    SMALL_BATCH_TOKENS tokens: from the fused projection qkv [T, (heads + 2 kv_heads) * dim] (rows
    may be strided) to the attention output [T, heads * dim]."""
    tokens, dim = qkv.shape[0], q_weight.shape[0]
    assert tokens <= SMALL_BATCH_TOKENS and qkv.stride(1) == 1 and fits_norm_rope_attention(dim)
    out = torch.empty(tokens, heads * dim, dtype=qkv.dtype, device=qkv.device)
    _norm_rope_attention_kernel[(heads,)](
        qkv, q_weight, k_weight, positions, cache, seq_ids, out, tokens, qkv.stride(0), eps, scale,
        H=heads, HK=kv_heads, HALF=dim // 2, CAUSAL=causal,
        BLOCK_T=max(16, triton.next_power_of_2(tokens)), num_warps=4,
    )  # fmt: skip
    return out


@triton.jit
def _quantize_rows(x_ptr, q_ptr, scale_ptr, dim, stride, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / FP8_MAX
    q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + row * dim + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rose.ops.fp8.quantize_rows_reference in one pass: x [tokens, k] (rows may be strided) to
    e4m3 [tokens, k] and float32 scales [tokens, 1]."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, dim = x.shape
    q = torch.empty(rows, dim, dtype=FP8, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows:
        _quantize_rows[(rows,)](x, q, scale, dim, x.stride(0), FP8_MAX=FP8_MAX, BLOCK=triton.next_power_of_2(dim))
    return q, scale
