"""Qwen3's per-head QK-norm and RoPE in the QKV product's epilogue: a quack GEMM (quack-kernels
comes with flash-attn-4) whose epilogue sums each head's squares, scales the head by its rstd and
the norm weight, and rotates each pair of columns by the token's position times the pair's
frequency, computed in the kernel; v's columns pass through (norm weight 0 plus 1, frequency 0).
This saves ROSE's separate kernel's pass over q and k (benches/qkv_epilogue.py). It pays on large
steps, so an engine loads it on a thread when the first one comes (rose.ops.large_steps).

quack rotates adjacent column pairs where Qwen3 rotates halves (NeoX), so the fused product reads
a copy of each layer's QKV weight whose q and k rows are reordered per head (2j <- j, 2j+1 <- j +
dim / 2). Attention's q.k is the same under one reordering of both, and v keeps its order, so the
attention's output is the unfused path's. The copy costs the QKV weights' memory once more."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rose.ops.large_steps import LargeStepKernel, checked_error, quack_unsupported

log = logging.getLogger(__name__)

MIN_TOKENS = 4096
"""The smallest step (in padded tokens) that takes the fused product, as for the fused SwiGLU
(benches/qkv_epilogue.py measures 4,096 and up)."""

HEAD_DIM = 128
"""The head size the fused product serves: its tiles are 128 columns wide, and a head's squares
must sum within one tile."""

TILES = {"tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": True}
"""quack's GEMM configuration: the fastest of those swept on an H100 (benches/RESULTS.md)."""

QkvProduct = Callable[..., torch.Tensor]
"""(x [tokens, hidden], weight [rows, hidden], positions [tokens] float32, freq [rows], norm
[rows], keep [rows]) -> the normed and rotated q and k, then v [tokens, rows]."""


@dataclass(frozen=True)
class QkvShape:
    """What the fused product is compiled and bound for: one decoder's attention projection."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    eps: float

    @property
    def qk_rows(self) -> int:
        """q's and k's rows of the fused weight, first."""
        return (self.heads + self.kv_heads) * self.head_dim

    @property
    def rows(self) -> int:
        """All its rows: q's, k's, then v's."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def pair_order(head_dim: int) -> torch.Tensor:
    """Where each of a head's pair-ordered columns comes from in its NeoX (halves) order."""
    return torch.tensor([j // 2 + (j % 2) * (head_dim // 2) for j in range(head_dim)])


def paired(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t's rows (or elements) in pair order within each head of `head_dim`."""
    order = pair_order(head_dim).to(t.device)
    return t.reshape(-1, head_dim, *t.shape[1:])[:, order].reshape(t.shape).contiguous()


def interleaved_freq(inv_freq: torch.Tensor, shape: QkvShape) -> torch.Tensor:
    """[rows] float32: each rotated pair's frequency in turns (angle / 2 pi) as the sum of two
    float32s, hi at the pair's even column and lo at its odd one, repeated over q's and k's heads;
    zero over v's columns (no rotation). The layout quack's in-kernel rotation reads, which keeps
    the angle exact to far beyond float32 at large positions; quack's make_interleaved_inv_freq
    builds the same (tests/gpu), but quack does not import without a GPU."""
    turns = inv_freq.double() / (2 * math.pi)
    hi = turns.float()
    lo = (turns - hi.double()).float()
    head = torch.stack([hi, lo], dim=-1).flatten()
    rotated = head.repeat(shape.heads + shape.kv_heads)
    return torch.cat([rotated, rotated.new_zeros(shape.rows - shape.qk_rows)])


def reference(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, freq: torch.Tensor,
              norm: torch.Tensor, keep: torch.Tensor, shape: QkvShape) -> torch.Tensor:  # fmt: skip
    """The fused product's arithmetic in float32 torch: the kernel's check, and its stand-in in
    tests without a GPU."""
    acc = x.float() @ weight.float().t()
    heads = acc.unflatten(1, (-1, shape.head_dim))
    rstd = torch.rsqrt(heads.square().mean(-1, keepdim=True) + shape.eps).expand_as(heads).flatten(1)
    y = acc * (rstd * norm.float() + keep.float())
    turns = positions.double()[:, None] * (freq[0::2].double() + freq[1::2].double())
    cos, sin = (f(2 * math.pi * turns).float() for f in (torch.cos, torch.sin))
    x1, x2 = y[:, 0::2], y[:, 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(1)


@functools.cache
def _epilogue(eps: float):  # noqa: ANN202 - quack's EpiMod
    """quack's GEMM epilogue for `eps`. Its in-kernel rotation is the one quack's own
    rope_posfreq epilogue uses (a float-float angle in turns, reduced exactly), through quack's
    private helpers: a quack without them fails the load, and the unfused path keeps serving."""
    from quack.epilogue.frontend import gemm_epilogue, pack, unpack
    from quack.epilogue.head_rmsnorm import HeadRstd
    from quack.epilogue.ops import ColVecLoad, RowVecLoad
    from quack.epilogue.rotary import _angle_turns, _sincos_turns

    def squares(acc):  # noqa: ANN001, ANN202
        return {"qk": acc * acc}

    @gemm_epilogue(
        ops={"pos": ColVecLoad("pos"), "freq": RowVecLoad("freq"), "qk": HeadRstd("qk", eps=eps),
             "w": RowVecLoad("w"), "keep": RowVecLoad("keep")},
        prepass=squares,
        prepass_outs=("qk",),
        mode="acc_pair",
    )  # fmt: skip
    def qkv_norm_rope(acc, pos, freq, qk, w, keep):  # noqa: ANN001, ANN202
        x1, x2 = unpack(acc * (qk * w + keep))
        s, c = _sincos_turns(*_angle_turns(pos, freq))
        return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}

    return qkv_norm_rope


def compile_for(
    shape: QkvShape, dtype: torch.dtype, device: torch.device, tiles: dict[str, object] = TILES
) -> QkvProduct:
    """The fused product for `shape`, imported, compiled (the token count is dynamic: one compile
    serves every step) and checked against `reference` on random inputs. Blocking; runs on a
    stream of its own, so a thread may call it while the engine's thread runs or captures steps.
    `tiles`: quack's GemmConfig (benches/qkv_epilogue.py sweeps them)."""
    from quack.gemm_config import GemmConfig

    mod, config = _epilogue(shape.eps), GemmConfig(**tiles, is_dynamic_persistent=False)

    def fused(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, freq: torch.Tensor,
              norm: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return mod(x, weight.t(), pos=positions, freq=freq, qk=shape.head_dim, w=norm, keep=keep, out_dtype=x.dtype,
                   tuned=False, config=config)["D"]  # fmt: skip

    with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)), torch.inference_mode():
        generator = torch.Generator(device).manual_seed(0)
        x = torch.randn(MIN_TOKENS, shape.hidden, device=device, dtype=dtype, generator=generator)
        weight = torch.randn(shape.rows, shape.hidden, device=device, dtype=dtype, generator=generator)
        weight *= shape.hidden**-0.5
        positions = torch.randint(0, 8192, (MIN_TOKENS,), device=device, generator=generator).float()
        freq = interleaved_freq(torch.rand(shape.head_dim // 2, device=device, generator=generator), shape)
        norm = 1 + 0.1 * torch.randn(shape.rows, device=device, generator=generator)
        args = (positions, freq, norm, qk_keep(shape, device))
        error = checked_error("the fused QKV product", fused(x, weight, *args), reference(x, weight, *args, shape))
    log.info("the fused QKV product compiled for %s (relative error %.1e)", shape, error)
    return fused


def qk_keep(shape: QkvShape, device: torch.device) -> torch.Tensor:
    """[rows] float32: 1 over v's columns (kept as the product made them), 0 over q's and k's."""
    keep = torch.zeros(shape.rows, device=device)
    keep[shape.qk_rows :] = 1
    return keep


class FusedQkv:
    """The fused product bound to a model's layers: their pair-ordered weight copies and the
    per-column vectors its epilogue reads."""

    def __init__(self, product: QkvProduct, shape: QkvShape, inv_freq: torch.Tensor,
                 layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:  # fmt: skip
        """`layers`: each layer's QKV weight [rows, hidden] and its q and k norm weights."""
        device = layers[0][0].device
        self.product = product
        self.freq, self.keep = interleaved_freq(inv_freq.to(device), shape), qk_keep(shape, device)
        self.weights, self.norms = [], []
        for weight, q_norm, k_norm in layers:
            qk = shape.qk_rows
            self.weights.append(torch.cat([paired(weight[:qk], shape.head_dim), weight[qk:]]))
            norm = torch.cat([q_norm.float().repeat(shape.heads), k_norm.float().repeat(shape.kv_heads)])
            self.norms.append(torch.cat([paired(norm, shape.head_dim), norm.new_zeros(shape.rows - qk)]))

    def __call__(self, layer: int, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s q and k (normed, rotated, in pair order) and v: [tokens, rows]."""
        return self.product(x, self.weights[layer], positions, self.freq, self.norms[layer], self.keep)

    @property
    def bytes(self) -> int:
        """The weight copies' size."""
        return sum(w.numel() * w.element_size() for w in self.weights)


def qk_rope_kernel(
    mode: str,
    shape: QkvShape | None,
    dtype: torch.dtype,
    device: torch.device,
    load: Callable[[QkvShape, torch.dtype, torch.device], QkvProduct] = compile_for,
) -> LargeStepKernel[QkvProduct]:
    """An engine's fused QK-norm and RoPE for a model whose attention projection is `shape` (None:
    no 16-bit QKV product with QK-norm), in `mode` auto or off."""

    def why() -> str | None:
        if shape is None:
            return "the model has no 16-bit QKV product with per-head QK-norm"
        if shape.head_dim != HEAD_DIM:
            return f"heads of {shape.head_dim} (the fused product serves {HEAD_DIM})"
        return quack_unsupported(device, dtype)

    return LargeStepKernel("fused QK-norm and RoPE", mode, MIN_TOKENS, why, lambda: load(shape, dtype, device))
