"""Where the host's time goes in one engine step of a 16-token query (GPU only).

Prints the p50 of `step()` alone (the host enqueuing the batch: uploads, attention plan, graph
replay, the result's copy) and of `step()` plus waiting for the vectors, then a cProfile of 300
such steps, sorted by own time. With --qwen3 0.6b, a random Qwen3-0.6B-shape model; else MiniLM.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rose

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))


def timed_steps(engine: rose.Engine, n: int) -> tuple[float, float]:
    """p50 milliseconds of step() alone and of step() plus wait()."""
    ids, cu = np.arange(1000, 1016, dtype=np.int32), np.array([0, 16], dtype=np.int32)
    enqueue, total = [], []
    for _ in range(n):
        start = time.perf_counter()
        lazy = engine.step(ids, cu)
        enqueued = time.perf_counter()
        lazy.wait()
        total.append(time.perf_counter() - start)
        enqueue.append(enqueued - start)
    return float(np.median(enqueue) * 1e3), float(np.median(total) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--qwen3", choices=["tiny", "0.6b"], help="random Qwen3 of this shape instead of MiniLM")
    args = parser.parse_args()
    folder = None
    if args.qwen3:
        from support import save_qwen3

        folder = save_qwen3(Path(tempfile.mkdtemp()) / "qwen3", args.qwen3, bidirectional=False)
    engine = rose.Engine(folder, device="cuda")
    print(f"attention {engine.describe()['attention_backend']}")
    timed_steps(engine, 50)  # the first hit runs eagerly, the second captures
    enqueue, total = timed_steps(engine, 300)
    print(f"step p50 {enqueue:.3f} ms, step+wait p50 {total:.3f} ms")
    profile = cProfile.Profile()
    profile.enable()
    timed_steps(engine, 300)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(28)
    print(out.getvalue())
    print(engine.stats()["cuda_graphs"])


if __name__ == "__main__":
    main()
