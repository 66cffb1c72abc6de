"""Kernel variants timed in turns in one process (the kernel lab; lab.py says how to make them).

    python benches/kernel_lab/variants.py FOLDER NAME=SOURCE:MACROS ...

SOURCE is a .cu path or "ship"; MACROS are NAME=VALUE separated by spaces (quote the argument).
Each variant: 20 launches back to back between CUDA events, the median of ROUNDS (7) rounds taken
in turns; and the cosine of its vector against the first variant's."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from lab import Lab  # noqa: E402


def main() -> None:
    lab = Lab(Path(sys.argv[1]))
    variants = {}
    for arg in sys.argv[2:]:
        name, spec = arg.split("=", 1)
        source, _, macros = spec.partition(":")
        variants[name] = lab.compile(source, macros.split())
    first = lab.run(next(iter(variants.values()))).clone()
    for name, variant in variants.items():
        cosine = torch.nn.functional.cosine_similarity(lab.run(variant), first).min().item()
        barrier = int(lab.decoder.barrier.abs().sum())
        print(f"{name}: cosine against the first {cosine:.6f}; barrier left {barrier}")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(int(os.environ.get("ROUNDS", 7))):
        for name, variant in variants.items():
            times[name].append(lab.milliseconds(variant))
    print("| variant | kernel ms, median | min | max |\n|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.4f} | {min(values):.4f} | {max(values):.4f} |")


if __name__ == "__main__":
    main()
