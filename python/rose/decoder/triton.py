"""The Triton fused decoder: a Qwen3-style decoder's layers in one persistent Triton launch, for
single queries (at most 16 tokens), at the sizes and on the GPUs that rose.decoder.cuda's kernel
does not take (that one is faster where it runs).

On a short query every layer is a chain of small dependent kernels, and each GEMM starts by
waiting for its weights to come from memory: the chain takes several times as long as reading
the weights. Here one program per SM runs every layer: the programs split each GEMM's output
columns (or, for the two GEMMs that add into the residual, columns and the inner dimension) and
meet at a grid-wide barrier between phases, so that the work between two weights' reads is a
barrier instead of a kernel launch in a graph.

Phases of a layer: QKV (the input RMSNorm folded in: norm(x) @ W = rstd * ((x * g) @ W)),
attention and O (a task is one head, with QK-norm, RoPE and softmax over the block-diagonal mask,
times a block of O's columns, added into the float32 residual with atomics), gate-up (the
post-attention RMSNorm folded in, SiLU-and-mul in the epilogue), down (added into the residual).
Activations are read with `.cg` loads (L2, not the SM's L1, which does not see the other
programs' writes).

The barrier needs every program resident at once (one per SM). Other kernels only delay it, but
two launches of it running together on one GPU (two streams, or two processes under MPS) could
each hold part of the SMs and wait for each other; an engine runs its steps on one stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rose.batch import RaggedBatch
from rose.decoder.base import DecoderWeights
from rose.decoder.stacks import LAYER_TENSORS, stack_layers
from rose.models.pooling import pool
from rose.ops import kernels
from rose.ops.triton_kernels import fits_norm_rope_attention, norm_rope_attend

MAX_TOKENS = 16
"""The largest (padded) batch the kernel takes: one tile of rows, the fewest tl.dot takes. Its
GEMMs are bound by the latency of their weights' loads, not by the rows; with 64-row tiles a
64-token batch took twice as long as the layer-by-layer path, so longer batches take that."""

_ROWS = tl.constexpr(MAX_TOKENS)


@triton.jit
def _sync(barrier_ptr, target):
    """Grid-wide barrier: waits until the programs' arrivals at barrier_ptr reach `target`;
    returns it (the next barrier's target is GRID more)."""
    tl.debug_barrier()
    tl.atomic_add(barrier_ptr, 1, sem="release", scope="gpu")
    # Polled with atomics. Slower: plain volatile loads of the counter, and a flag on a
    # line of its own set by the last arrival (polled with volatile or ld.acquire loads).
    while tl.atomic_add(barrier_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()
    return target


@triton.jit
def _rows_dot(
    a_ptr, a_stride, n_tokens, w_ptr, w2_ptr, w_stride, cols, k_len, g_ptr,
    NORM: tl.constexpr, TWO: tl.constexpr, TILE: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """The token rows of a (times g when NORM) against `cols` rows of w (and of w2 when TWO), over
    k_len: returns the products [16, TILE] in float32 and, when NORM, the sum of squares of a's rows."""
    m = tl.arange(0, _ROWS)
    kk = tl.arange(0, BK)[None, :]
    a_rows = a_ptr + m[:, None] * a_stride + kk
    w_rows = tl.arange(0, TILE)[:, None] * w_stride + kk
    row_ok = (m < n_tokens)[:, None]
    col_ok = (tl.arange(0, TILE) < cols)[:, None]
    acc = tl.zeros((_ROWS, TILE), tl.float32)
    acc2 = tl.zeros((_ROWS, TILE), tl.float32)
    squares = tl.zeros((_ROWS,), tl.float32)
    for k in tl.range(0, k_len, BK, num_stages=3):  # 3 stages: the fastest of 1 to 4
        a = tl.load(a_rows + k, mask=row_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        if NORM:
            squares += tl.sum(a * a, axis=1)
            a = a * tl.load(g_ptr + k + kk).to(tl.float32)
        w = tl.load(w_ptr + w_rows + k, mask=col_ok, other=0.0)
        a = a.to(w.dtype)
        acc = tl.dot(a, tl.trans(w), acc)
        if TWO:
            acc2 = tl.dot(a, tl.trans(tl.load(w2_ptr + w_rows + k, mask=col_ok, other=0.0)), acc2)
    return acc, acc2, squares


@triton.jit
def _store_rows(ptr, stride, n_tokens, n0, cols, values, TILE: tl.constexpr):
    m = tl.arange(0, _ROWS)[:, None]
    n = tl.arange(0, TILE)[None, :]
    tl.store(ptr + m * stride + n0 + n, values.to(ptr.dtype.element_ty), mask=(m < n_tokens) & (n < cols))


@triton.jit
def _normed_phase(x_ptr, out_ptr, w_ptr, g_ptr, n_tokens, eps, pid, GRID: tl.constexpr, HIDDEN: tl.constexpr,
                  N: tl.constexpr, COLS: tl.constexpr, TILE: tl.constexpr, BK: tl.constexpr,
                  GATED: tl.constexpr):  # fmt: skip
    """out [tokens, N] = RMSNorm(x) @ w^T; GATED: w is gate then up (N rows each), out = SiLU(gate) * up."""
    task = pid
    while task < tl.cdiv(N, COLS):
        n0 = task * COLS
        cols = tl.minimum(COLS, N - n0)
        acc, up, squares = _rows_dot(
            x_ptr, HIDDEN, n_tokens, w_ptr + n0 * HIDDEN, w_ptr + (N + n0) * HIDDEN, HIDDEN, cols, HIDDEN, g_ptr,
            True, GATED, TILE, BK,
        )  # fmt: skip
        rstd = tl.rsqrt(squares / HIDDEN + eps)[:, None]
        acc = acc * rstd
        if GATED:
            acc = acc / (1.0 + tl.exp(-acc)) * (up * rstd)
        _store_rows(out_ptr, N, n_tokens, n0, cols, acc, TILE)
        task += GRID


@triton.jit
def _residual_phase(a_ptr, x_ptr, w_ptr, n_tokens, pid, GRID: tl.constexpr,
                    HIDDEN: tl.constexpr, K: tl.constexpr, COLS: tl.constexpr, TILE: tl.constexpr,
                    SPLIT: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """x += a @ w^T, the output columns and the inner dimension shared out among the programs."""
    k_len: tl.constexpr = K // SPLIT
    task = pid
    while task < tl.cdiv(HIDDEN, COLS) * SPLIT:
        n0 = (task // SPLIT) * COLS
        k0 = (task % SPLIT) * k_len
        cols = tl.minimum(COLS, HIDDEN - n0)
        acc, _, _ = _rows_dot(
            a_ptr + k0, K, n_tokens, w_ptr + n0 * K + k0, w_ptr, K, cols, k_len, w_ptr, False, False, TILE, BK
        )
        m = tl.arange(0, _ROWS)[:, None]
        n = tl.arange(0, TILE)[None, :]
        tl.atomic_add(x_ptr + m * HIDDEN + n0 + n, acc, mask=(m < n_tokens) & (n < cols), sem="relaxed")
        task += GRID


@triton.jit
def _attention_o_phase(qkv_ptr, x_ptr, o_w_ptr, n_tokens, q_norm_ptr, k_norm_ptr, positions_ptr, rope_ptr, seq_ptr,
                       eps, scale, pid, GRID: tl.constexpr, HIDDEN: tl.constexpr, HQ: tl.constexpr,
                       HK: tl.constexpr, HALF: tl.constexpr, CAUSAL: tl.constexpr, COLS: tl.constexpr):  # fmt: skip
    """x += attention(qkv) @ o_w^T. A task is one head times a block of COLS output columns (the
    heads' parts added with atomics); the block's weights are loaded first, so that their trip from
    memory overlaps the attention, which the tasks of a head each compute (it is small). One phase
    instead of two saves a barrier a layer."""
    D: tl.constexpr = 2 * HALF
    QD: tl.constexpr = HQ * D
    PARTS: tl.constexpr = (HIDDEN + COLS - 1) // COLS
    n = tl.arange(0, COLS)
    m = tl.arange(0, _ROWS)[:, None]
    task = pid
    while task < HQ * PARTS:
        head = task // PARTS
        n0 = (task % PARTS) * COLS
        col_ok = n0 + n < HIDDEN
        w = tl.load(o_w_ptr + (n0 + n)[:, None] * QD + head * D + tl.arange(0, D)[None, :], mask=col_ok[:, None])
        # .cg: the q, k and v rows were written by other programs.
        out = norm_rope_attend(qkv_ptr, QD + 2 * HK * D, head, n_tokens, q_norm_ptr, k_norm_ptr, positions_ptr,
                               rope_ptr, seq_ptr, eps, scale, HQ, HK, HALF, CAUSAL, _ROWS, ".cg")  # fmt: skip
        acc = tl.dot(out.to(w.dtype), tl.trans(w))
        tl.atomic_add(x_ptr + m * HIDDEN + n0 + n[None, :], acc, mask=(m < n_tokens) & col_ok[None, :], sem="relaxed")
        task += GRID


@triton.jit
def _decoder_kernel(
    x_ptr, qkv_ptr, act_ptr, count_ptr, positions_ptr, seq_ptr, rope_ptr, barrier_ptr,
    in_norm_ptr, qkv_w_ptr, q_norm_ptr, k_norm_ptr, o_w_ptr, post_norm_ptr, gate_up_w_ptr, down_w_ptr,
    eps, scale, NUM_LAYERS: tl.constexpr,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
    CAUSAL: tl.constexpr, QKV_COLS: tl.constexpr, QKV_TILE: tl.constexpr, O_COLS: tl.constexpr,
    GU_COLS: tl.constexpr, GU_TILE: tl.constexpr, DOWN_COLS: tl.constexpr, DOWN_TILE: tl.constexpr,
    DOWN_SPLIT: tl.constexpr, BK: tl.constexpr, GRID: tl.constexpr,
):  # fmt: skip
    """Every layer on x [tokens, HIDDEN] float32, in place; the weights are stacked by layer."""
    pid = tl.program_id(0)
    n_tokens = tl.load(count_ptr)
    QD: tl.constexpr = HQ * 2 * HALF
    NQKV: tl.constexpr = QD + 2 * HK * 2 * HALF
    arrivals = 0
    for layer in range(NUM_LAYERS):
        _normed_phase(x_ptr, qkv_ptr, qkv_w_ptr, in_norm_ptr, n_tokens, eps, pid, GRID, HIDDEN, NQKV, QKV_COLS,
                      QKV_TILE, BK, False)  # fmt: skip
        arrivals = _sync(barrier_ptr, arrivals + GRID)
        _attention_o_phase(qkv_ptr, x_ptr, o_w_ptr, n_tokens, q_norm_ptr, k_norm_ptr, positions_ptr, rope_ptr,
                           seq_ptr, eps, scale, pid, GRID, HIDDEN, HQ, HK, HALF, CAUSAL, O_COLS)  # fmt: skip
        arrivals = _sync(barrier_ptr, arrivals + GRID)
        _normed_phase(x_ptr, act_ptr, gate_up_w_ptr, post_norm_ptr, n_tokens, eps, pid, GRID, HIDDEN, INTER,
                      GU_COLS, GU_TILE, BK, True)  # fmt: skip
        arrivals = _sync(barrier_ptr, arrivals + GRID)
        _residual_phase(act_ptr, x_ptr, down_w_ptr, n_tokens, pid, GRID, HIDDEN, INTER, DOWN_COLS, DOWN_TILE,
                        DOWN_SPLIT, BK)  # fmt: skip
        if layer + 1 < NUM_LAYERS:
            arrivals = _sync(barrier_ptr, arrivals + GRID)
        in_norm_ptr += HIDDEN
        post_norm_ptr += HIDDEN
        q_norm_ptr += 2 * HALF
        k_norm_ptr += 2 * HALF
        qkv_w_ptr += NQKV * HIDDEN
        o_w_ptr += HIDDEN * QD
        gate_up_w_ptr += 2 * INTER * HIDDEN
        down_w_ptr += HIDDEN * INTER
    # The last program out sets the barrier back for the next launch (every other one has left it).
    if tl.atomic_add(barrier_ptr + 1, 1, sem="acq_rel", scope="gpu") == GRID - 1:
        tl.atomic_xchg(barrier_ptr, 0)
        tl.atomic_xchg(barrier_ptr + 1, 0)


@dataclass(frozen=True)
class Split:
    """How the programs share a GEMM with n output columns: `cols` columns a task (in a tile of
    `tile`), the inner dimension cut in `split` parts."""

    cols: int
    tile: int
    split: int = 1

    def tasks(self, n: int) -> int:
        return -(-n // self.cols) * self.split


def split_columns(n: int, k: int, programs: int, block_k: int, may_split_k: bool) -> Split | None:
    """About `programs` tasks for a GEMM [n, k]: columns first, then (at 16 columns, the smallest
    tile) the inner dimension when the GEMM's output is a sum that may arrive in parts. None when
    k does not divide into blocks of block_k."""
    cols = -(-n // programs)
    split = 1
    if cols < MAX_TOKENS:
        cols = MAX_TOKENS  # the smallest tile tl.dot takes
        if may_split_k:
            split = max(1, programs // -(-n // cols))
            while split > 1 and k % (split * block_k):
                split -= 1
    if k % (split * block_k):
        return None
    return Split(cols, triton.next_power_of_2(cols), split)


class TritonDecoder:
    """_decoder_kernel as a rose.decoder.Decoder: the embedding's rows, the layers in one launch,
    then the final norm and the pooling. Takes the layers' weights over: they are stacked by
    layer, and each layer's tensors become views into the stacks, so the eager path and the
    kernel share one copy."""

    name = "triton"
    max_tokens = MAX_TOKENS

    def __init__(self, weights: DecoderWeights, device: torch.device, programs: int | None = None,
                 block_k: int = 256, num_warps: int = 8) -> None:  # fmt: skip
        """`programs`: the grid (default: one a SM); `block_k`: the inner dimension's block (256
        was the fastest of 128, 256 and 512)."""
        first, spec = weights.layers[0], weights.spec
        self._weights = weights
        self.hidden = first.input_norm.shape[0]
        self.inter = first.down.weight.shape[1]
        self.head_dim, self.heads, self.kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
        self.causal, self.scale, self.eps = spec.causal, spec.scale, weights.eps
        self.num_layers = len(weights.layers)
        self.block_k, self.num_warps = block_k, num_warps
        # Its attention is norm_rope_attention's, with the same limits on the head dim.
        if not fits_norm_rope_attention(self.head_dim):
            raise ValueError(f"head_dim {self.head_dim} does not fit the Triton decoder's attention")
        if programs is None:
            programs = torch.cuda.get_device_properties(device).multi_processor_count
        n_qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = split_columns(n_qkv, self.hidden, programs, block_k, False)
        self.gate_up = split_columns(self.inter, self.hidden, programs, block_k, False)
        self.down = split_columns(self.hidden, self.inter, programs, block_k, True)
        if self.qkv is None or self.gate_up is None or self.down is None:
            raise ValueError("the model's dimensions do not divide into the kernel's blocks")
        # Attention and O: a head times a block of O's output columns a task, about one a program.
        self.o_cols = max(MAX_TOKENS, triton.next_power_of_2(-(-self.hidden * self.heads // programs)))
        tasks = [self.qkv.tasks(n_qkv), self.heads * -(-self.hidden // self.o_cols), self.gate_up.tasks(self.inter),
                 self.down.tasks(self.hidden)]  # fmt: skip
        self.programs = min(programs, max(tasks))
        self.stacks = stack_layers(weights.layers)
        self.barrier = torch.zeros(2, dtype=torch.int32, device=device)

    def describe(self) -> dict:
        return {"kernel": self.name, "max_tokens": MAX_TOKENS, "programs": self.programs, "block_k": self.block_k}

    def __call__(self, batch: RaggedBatch, pooling: str) -> torch.Tensor:
        """The batch's pooled float32 vectors [sequences, hidden]."""
        w = self._weights
        x = w.embed[batch.input_ids].float()
        self.run_layers(x, batch)
        return pool(kernels.rmsnorm(x.to(w.final_norm.dtype), w.final_norm, w.eps), batch, pooling)

    def run_layers(self, x: torch.Tensor, batch: RaggedBatch) -> None:
        """Runs every layer on the embeddings x [tokens, hidden] float32, in place."""
        assert x.shape[0] <= MAX_TOKENS and x.dtype == torch.float32 and x.is_contiguous()
        n_qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        tensors = _kernel_tensors(x, batch, self._weights.rope, self.barrier, self.stacks, n_qkv, self.inter)
        _decoder_kernel[(self.programs,)](
            *tensors,
            self.eps, self.scale, NUM_LAYERS=self.num_layers,
            HIDDEN=self.hidden, INTER=self.inter, HQ=self.heads, HK=self.kv_heads, HALF=self.head_dim // 2,
            CAUSAL=self.causal, QKV_COLS=self.qkv.cols, QKV_TILE=self.qkv.tile, O_COLS=self.o_cols,
            GU_COLS=self.gate_up.cols, GU_TILE=self.gate_up.tile, DOWN_COLS=self.down.cols,
            DOWN_TILE=self.down.tile, DOWN_SPLIT=self.down.split, BK=self.block_k, GRID=self.programs,
            num_warps=self.num_warps,
        )  # fmt: skip


def _kernel_tensors(
    x: torch.Tensor, batch: RaggedBatch, rope: torch.Tensor, barrier: torch.Tensor, stacks: dict[str, torch.Tensor],
    qkv_width: int, inter: int,
) -> list[torch.Tensor]:  # fmt: skip
    """The kernel's tensor arguments: x, their scratch q/k/v [tokens, qkv_width] and activation
    [tokens, inter], the token count (the batch's, or x's rows), positions, sequence ids, rope,
    the grid barrier, then the stacks in LAYER_TENSORS' order."""
    tokens, dtype, device = x.shape[0], stacks["qkv"].dtype, x.device
    qkv = torch.empty(tokens, qkv_width, dtype=dtype, device=device)
    act = torch.empty(tokens, inter, dtype=dtype, device=device)
    count = batch.device_token_count()
    return [x, qkv, act, count, batch.positions, batch.seq_ids, rope, barrier, *(stacks[n] for n in LAYER_TENSORS)]
