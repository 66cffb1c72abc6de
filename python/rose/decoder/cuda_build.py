"""Which models rose.decoder.cuda's kernel (decoder_kernel.cu) takes and how NVRTC builds it,
without torch: rose.loading.prestart compiles it while torch imports, so that the first start on a
machine does not spend NVRTC's second after the import (later starts read the cubin from disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rose.runtime import nvrtc

MAX_TOKENS = 16
"""The largest (padded) batch the kernel takes: the M of one tensor-core product."""

STAGES = 8
"""Weight chunks of 16 KB in flight a block (6 and 10 were no faster)."""

THREADS = 288
"""A block's threads: 8 consumer warps and the producer warp."""

SOURCE = Path(__file__).with_name("decoder_kernel.cu")

SQUARES = 1024
"""Where the rows' sums of squares lie in the barrier tensor: 4 KB from the counter every block polls."""

_SLOT = 16384  # bytes of a weight chunk in shared memory
_MAX_SHARED = 227 * 1024  # Hopper's shared memory a block
_STATIC_SHARED = 256  # the kernel's `started` and token_seq, token_pos, as ptxas places them


def fits(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, sms: int) -> bool:
    """Whether the kernel takes a model of these sizes on a GPU of `sms` SMs: a block a group of 8
    of x's columns (so HID / 8 blocks, all resident), a chunk of 8 weight rows over the hidden
    dimension (16 KB), heads of 128 dims split evenly over the blocks."""
    grid = hidden // 8
    return (
        hidden * 8 * 2 == _SLOT
        and grid <= sms
        and head_dim == 128
        and heads % kv_heads == 0
        and grid % heads == 0
        and ((heads + 2 * kv_heads) * head_dim) % (grid * 8) == 0
        and (hidden // (grid // heads)) % (_SLOT // 2 // head_dim) == 0
        and inter % (grid * 8) == 0
        and inter % hidden == 0
        and shared_bytes(hidden, inter, heads, kv_heads, head_dim) + _STATIC_SHARED <= _MAX_SHARED
    )


def shared_bytes(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """The kernel's shared memory, as laid out there: the ring and its mbarriers, the warps'
    partial products and squares, the attention's q and k as loaded, its q, k, v and output."""
    grid, rows = hidden // 8, MAX_TOKENS
    chunks = max((heads + 2 * kv_heads) * head_dim // grid // 8, 2 * (inter // grid) // 8)
    ring = STAGES * (_SLOT + 16)
    partials = chunks * 8 * 128 * 4 + 8 * 16 * 4
    attention = 2 * rows * head_dim * 2 + 3 * rows * head_dim * 2 + rows * (head_dim * 2 + 16)
    return ring + partials + attention


def kernel_options(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, layers: int, causal: bool, fp16: bool
) -> list[str]:
    """NVRTC's -D options for decoder_kernel.cu at these sizes (the macros its header lists)."""
    sizes = dict(HID=hidden, INTER=inter, HQ=heads, HK=kv_heads, D=head_dim, NLAYERS=layers, CAUSAL=int(causal),
                 GRID=hidden // 8, STAGES=STAGES, FP16=int(fp16), SQUARES=SQUARES)  # fmt: skip
    return [f"-D{name}={value}" for name, value in sizes.items()]


def compile_kernel(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, layers: int, causal: bool, fp16: bool, arch: int
) -> bytes:
    """The kernel's cubin for sm_{arch} at these sizes (rose.runtime.nvrtc: from its cache when it has it)."""
    options = kernel_options(hidden, inter, heads, kv_heads, head_dim, layers, causal, fp16)
    return nvrtc.compile_cubin(SOURCE.read_text(), "decoder_kernel", arch, options)


def qwen3_sizes(config: dict[str, Any]) -> dict[str, Any]:
    """The kernel's sizes of a Qwen3 config.json, read as rose.models.decoder_stack reads them: hidden,
    inter, heads, kv_heads, head_dim, layers and causal, compile_kernel's arguments."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    return dict(
        hidden=hidden,
        inter=config["intermediate_size"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads", heads),
        head_dim=config.get("head_dim") or hidden // heads,
        layers=config["num_hidden_layers"],
        causal=not config.get("use_bidirectional_attention", False),
    )
