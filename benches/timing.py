"""The one timing rule of the throughput benches: a warm-up run, then the best of a few."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` runs of `fn`, after one untimed run (JIT, allocator,
    lazy graph capture); the GPU's queued work is waited for on both sides of each run."""
    fn()
    _synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _synchronize()
        best = min(best, time.perf_counter() - start)
    return best
