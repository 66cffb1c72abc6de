"""SwiGLU's two products and its activation in one Triton GEMM: silu(x Wg^T) * (x Wu^T) from the
fused gate/up weight [2 n, k], with both accumulators in float32 and only the n-wide product
written. Unfused, the 2n-wide product goes out to memory and comes back for the activation."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
"""Tile sizes and pipeline depth (benches/swiglu_gemm.py measures the candidates)."""


@triton.jit
def _swiglu_matmul(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # Tiles in groups of GROUP_M rows so that neighbouring programs share weight tiles in L2.
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :]
    gate_tile = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # [BLOCK_K, BLOCK_N] of Wg^T
    up_tile = gate_tile + N * stride_wn
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_tile, mask=(rows[:, None] < M) & (ks[None, :] < k_left), other=0.0)
        w_mask = (ks[:, None] < k_left) & (cols[None, :] < N)
        gate = tl.dot(a, tl.load(gate_tile, mask=w_mask, other=0.0), gate)
        up = tl.dot(a, tl.load(up_tile, mask=w_mask, other=0.0), up)
        x_tile += BLOCK_K
        gate_tile += BLOCK_K
        up_tile += BLOCK_K
    out = gate / (1.0 + tl.exp(-gate)) * up
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu_matmul(x: torch.Tensor, weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for x [tokens, k] and weight [2 n, k] (gate rows, then up's)."""
    config = config or CONFIG
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens, k = x.shape
    n = weight.shape[0] // 2
    assert weight.shape[1] == k and weight.stride(-1) == 1
    out = torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    blocks = config["BLOCK_M"], config["BLOCK_N"]
    grid = (triton.cdiv(tokens, blocks[0]) * triton.cdiv(n, blocks[1]),)
    _swiglu_matmul[grid](x, weight, out, tokens, n, k, x.stride(0), weight.stride(0), out.stride(0), **config)
    return out
