"""Triton kernels for the decoder layer on small batches (online queries, up to 64 tokens).

At 16 tokens a Qwen3-0.6B layer is a dozen short kernels: cuBLAS's GEMMs read the weights at a
third of the memory bandwidth with these shapes, and every other kernel costs more in launch and
tail than in work. Here a layer is six kernels: the RMSNorm goes into the prologue of the GEMM
that follows it, the residual add and SiLU-and-mul into the epilogue of the GEMM before them, and
attention over the whole packed batch is one program per head (a block-diagonal mask keeps the
sequences apart). Each GEMM program owns a slice of output columns and streams its weights once.
Arithmetic and rounding follow Hugging Face's, as the torch reference in kernels.py does.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MAX_TOKENS = 64
"""The largest (padded) batch these kernels take; above it cuBLAS and FlashInfer are faster."""

# Programmatic dependent launch: each kernel may be scheduled while the one before it drains, and
# waits on it (griddepcontrol) before touching its outputs. Hopper and later; not in Triton's
# interpreter (the CPU tests). ROSE_PDL=0 turns it off.
ENABLE_PDL = os.environ.get("ROSE_PDL", "1") != "0" and os.environ.get("TRITON_INTERPRET", "0") == "0"


@functools.cache
def _pdl(device: torch.device) -> bool:
    return ENABLE_PDL and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _launch(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


# Output columns per program and the reduction step, per (N, K) of the weight; "warps" and
# "stages" are Triton's. Tuned on the H200 at 16 tokens (benches/skinny.py).
_DEFAULT = dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
CONFIGS: dict[tuple[int, int], dict] = {}

_PLAIN, _RESIDUAL, _SILU_AND_MUL = 0, 1, 2


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, out_ptr, norm_ptr, M, N, K, eps,
    NORM: tl.constexpr, EPILOGUE: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[:, cols] = epilogue(prologue(x) @ w[cols].T) for this program's BLOCK_N columns."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows[:, None] < M
    x_rows = x_ptr + rows[:, None].to(tl.int64) * K
    w_rows = w_ptr + cols[:, None].to(tl.int64) * K
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if NORM:  # RMSNorm of each row: its scale first, from a pass over the row
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x = tl.load(x_rows + k + ks[None, :], mask=row_mask, other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
        scale = tl.rsqrt(squares / K + eps)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_rows + k + ks[None, :], mask=row_mask, other=0.0)
        if NORM:  # rounded where Hugging Face rounds: after the norm, after the weight
            normed = (x.to(tl.float32) * scale).to(x.dtype).to(tl.float32)
            x = (tl.load(norm_ptr + k + ks).to(tl.float32)[None, :] * normed).to(x.dtype)
        acc += tl.dot(x, tl.trans(tl.load(w_rows + k + ks[None, :])))
        if EPILOGUE == 2:  # the up projection's rows follow the gate's N rows
            up += tl.dot(x, tl.trans(tl.load(w_rows + N * K + k + ks[None, :])))
    out = out_ptr + rows[:, None] * N + cols[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if EPILOGUE == 1:  # the residual stream: out += x @ w.T, rounded as two bf16 tensors add
        y = (tl.load(out, mask=row_mask).to(tl.float32) + y.to(tl.float32)).to(y.dtype)
    if EPILOGUE == 2:
        gate = y.to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up.to(y.dtype).to(tl.float32)).to(y.dtype)
    tl.store(out, y, mask=row_mask)


def _config(n: int, k: int) -> dict:
    """The launch parameters for a weight of N output columns and K inputs; small models get
    blocks no larger than their matrices."""
    config = dict(CONFIGS.get((n, k), _DEFAULT))
    config["BLOCK_N"] = min(config["BLOCK_N"], n)
    config["BLOCK_K"] = min(config["BLOCK_K"], k)
    return config


def fits_linear(weight: torch.Tensor, parts: int = 1) -> bool:
    """Whether the GEMM kernel takes this weight of `parts` matrices [N, K] stacked (gate and up
    are two): whole blocks of at least 16 (the smallest tl.dot) in both dimensions."""
    n, k = weight.shape[0] // parts, weight.shape[1]
    config = _config(n, k)
    blocks = ((n, config["BLOCK_N"]), (k, config["BLOCK_K"]))
    return all(size % block == 0 and block >= 16 and triton.next_power_of_2(block) == block for size, block in blocks)


def _linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, norm: torch.Tensor | None, eps: float,
            epilogue: int) -> torch.Tensor:  # fmt: skip
    m, k = x.shape
    n = out.shape[1]
    assert m <= MAX_TOKENS and x.is_contiguous() and weight.is_contiguous() and out.is_contiguous()
    config = _config(n, k)
    block_n = config.pop("BLOCK_N")
    pdl = _pdl(x.device)
    _linear_kernel[(n // block_n,)](
        x, weight, out, x if norm is None else norm, m, n, k, eps,
        NORM=norm is not None, EPILOGUE=epilogue, USE_PDL=pdl,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, **_launch(pdl), **config,
    )  # fmt: skip
    return out


def norm_linear(x: torch.Tensor, norm: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm(x) @ weight.T (no bias)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _linear(x, weight, out, norm, eps, _PLAIN)


def norm_linear_silu_and_mul(x: torch.Tensor, norm: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of RMSNorm(x) @ weight.T, weight being the gate's rows then the up's."""
    out = torch.empty(x.shape[0], weight.shape[0] // 2, dtype=x.dtype, device=x.device)
    return _linear(x, weight, out, norm, eps, _SILU_AND_MUL)


def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual += x @ weight.T, in place; returns residual."""
    return _linear(x, weight, residual, None, 0.0, _RESIDUAL)


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, seq_ptr, out_ptr, T, v_stride, scale,
    H: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """One head over every token of the batch; token i sees token j when both are of the same
    sequence (and j <= i when causal)."""
    head = tl.program_id(0)
    kv_head = head // (H // HK)
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)[None, :]
    valid = t < T
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    q = tl.load(q_ptr + (t[:, None] * H + head) * D + d, mask=valid[:, None], other=0.0)
    k = tl.load(k_ptr + (t[:, None] * HK + kv_head) * D + d, mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + t[:, None] * v_stride + kv_head * D + d, mask=valid[:, None], other=0.0)
    scores = tl.dot(q, tl.trans(k)) * scale
    seq_row = tl.load(seq_ptr + t, mask=valid, other=-1)
    seq_col = tl.load(seq_ptr + t, mask=valid, other=-2)
    seen = seq_row[:, None] == seq_col[None, :]
    if CAUSAL:
        seen = seen & (t[None, :] <= t[:, None])
    scores = tl.where(seen, scores, -1e30)  # finite: the padding rows see nothing and stay finite
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    out = tl.dot(p.to(v.dtype), v)
    tl.store(out_ptr + (t[:, None] * H + head) * D + d, out.to(v.dtype), mask=valid[:, None])


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_ids: torch.Tensor, causal: bool, scale: float
) -> torch.Tensor:
    """q [T, H, D], k [T, HK, D] contiguous, v [T, HK, D] with strided rows -> [T, H * D]."""
    tokens, heads, dim = q.shape
    assert tokens <= MAX_TOKENS and q.is_contiguous() and k.is_contiguous() and v.stride(1) == dim
    out = torch.empty(tokens, heads * dim, dtype=q.dtype, device=q.device)
    pdl = _pdl(q.device)
    _attention_kernel[(heads,)](
        q, k, v, seq_ids, out, tokens, v.stride(0), scale,
        H=heads, HK=k.shape[1], D=dim, CAUSAL=causal, USE_PDL=pdl,
        BLOCK_T=max(16, triton.next_power_of_2(tokens)), num_warps=4, **_launch(pdl),
    )  # fmt: skip
    return out


def fits_attention(head_dim: int, heads: int, kv_heads: int) -> bool:
    """Whether the attention kernel takes these heads (a power-of-two head dim of at least 16)."""
    return head_dim >= 16 and triton.next_power_of_2(head_dim) == head_dim and heads % kv_heads == 0
