"""The ragged batches, FLOP count and per-call timing that attention.py and attention_vllm.py
share. It imports no rose, so vLLM's environment can load it too."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import NamedTuple

import torch


class Shape(NamedTuple):
    """An attention shape, in AttentionSpec's order."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool


SHAPES = {
    "minilm d32": Shape(12, 12, 32, causal=False),
    "bert-base d64": Shape(12, 12, 64, causal=False),
    "qwen3 d128": Shape(16, 8, 128, causal=False),
    "qwen3 d128 causal": Shape(16, 8, 128, causal=True),
}

# (name, sequence length range, total tokens): queries, documents, half of a 1 x 100 rerank
# request's pairs (its first step), long documents.
BATCHES = [
    ("5-30", (5, 30), 4096),
    ("32-512", (32, 512), 16384),
    ("180-240", (180, 240), 10752),
    ("1k-4k", (1024, 4096), 32768),
]


def lengths(bounds: tuple[int, int], tokens: int, seed: int = 0) -> list[int]:
    """Sequence lengths drawn from `bounds` until they hold `tokens` (the same for every run)."""
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < tokens:
        out.append(rng.randint(*bounds))
    return out


def attention_flops(shape: Shape, seqs: list[int]) -> float:
    """The products' FLOPs with no padding: QK^T and PV, half of them under a causal mask."""
    full = sum(4 * n * n * shape.num_heads * shape.head_dim for n in seqs)
    return full / 2 if shape.causal else full


def median_ms(call: Callable[[], object], reps: int, device: torch.device) -> float:
    """Median ms of one call after three warm-up calls (CUDA events; the wall clock on the CPU)."""
    for _ in range(3):  # JIT and warm-up
        call()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            call()
            times.append((time.perf_counter() - begin) * 1e3)
    return median(times)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]
