"""How a step's waiter waits, in the engine on the GPU: LazyTensor.wait against the two simple
ways, each arm patched in turn into the same warmed engine.

    python benches/wait.py [--qwen3 0.6b] [--iterations 300] [--rounds 4]

Arms: `block` (the blocking event wait alone: what the waiter did before it slept to the step's
forecast end), `rose` (LazyTensor.wait as it is), `spin` (query() in a loop: the lower bound that
the waiter may not use, since it holds a core through every step). For 1 x 16, 8 x 32 and
32 x 128 tokens: the p50 from step() to the vectors on the host by round (arms in turns, the
order reversed every other round, since the machine drifts), the waiting thread's CPU time a
wait (time.thread_time), and for `rose` how many sleeps a wait took (1: the values were there
when it woke; more: it polled).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

import rose
from rose.serving import lazy
from rose.serving.lazy import LazyTensor

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from latency import engine_latencies  # noqa: E402

SHAPES = ((1, 16), (8, 32), (32, 128))
Wait = Callable[[LazyTensor], np.ndarray]


def block(self: LazyTensor) -> np.ndarray:
    if self.done is not None:
        self.done.synchronize()
    return self._host.numpy()


def spin(self: LazyTensor) -> np.ndarray:
    if self.done is not None:
        while not self.done.query():
            pass
    return self._host.numpy()


class Probe:
    """Wraps a wait to record its thread's CPU time and the number of lazy._sleep calls."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.sleeps: Counter[int] = Counter()
        self._count = 0
        sleep = lazy._sleep

        def counting(seconds: float) -> None:
            self._count += 1
            sleep(seconds)

        lazy._sleep = counting

    def around(self, wait: Wait) -> Wait:
        def probed(tensor: LazyTensor) -> np.ndarray:
            self._count, start = 0, time.thread_time()
            out = wait(tensor)
            self.cpu.append(time.thread_time() - start)
            self.sleeps[self._count] += 1
            return out

        return probed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen3", choices=["tiny", "0.6b"], help="random Qwen3 of this shape instead of MiniLM")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    folder = None
    if args.qwen3:
        from support import save_qwen3

        folder = save_qwen3(Path(tempfile.mkdtemp()) / "qwen3", args.qwen3, bidirectional=False)
    engine = rose.Engine(folder, device="cuda")
    arms: dict[str, Wait] = {"block": block, "rose": LazyTensor.wait, "spin": spin}
    probe = Probe()
    p50 = {(arm, shape): [] for arm in arms for shape in SHAPES}
    cpu = {(arm, shape): [] for arm in arms for shape in SHAPES}
    sleeps = {shape: Counter() for shape in SHAPES}
    for round_ in range(args.rounds):
        for arm in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            LazyTensor.wait = probe.around(arms[arm])
            for shape in SHAPES:
                probe.cpu.clear()
                probe.sleeps.clear()
                p50[arm, shape].append(float(np.median(engine_latencies(engine, *shape, args.iterations))))
                cpu[arm, shape].append(float(np.median(probe.cpu)) * 1e6)
                if arm == "rose":
                    sleeps[shape].update(probe.sleeps)
    LazyTensor.wait = arms["rose"]
    print(f"{'Qwen3 ' + args.qwen3 + ' shape' if folder else 'all-MiniLM-L6-v2'}, {args.rounds} rounds")
    for shape in SHAPES:
        print(f"{shape[0]} x {shape[1]} tokens, p50 ms by round: " + " | ".join(
            f"{arm} {[round(x, 3) for x in p50[arm, shape]]} median {np.median(p50[arm, shape]):.3f}" for arm in arms
        ))  # fmt: skip
        print("   waiting thread's CPU us a wait (median of rounds' p50): "
              + ", ".join(f"{arm} {np.median(cpu[arm, shape]):.0f}" for arm in arms)
              + f"; rose's sleeps a wait: {dict(sorted(sleeps[shape].items()))}")  # fmt: skip


if __name__ == "__main__":
    main()
