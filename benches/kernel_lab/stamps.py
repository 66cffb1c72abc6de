"""Where a layer's time goes: clock64 stamps (STAMPS=1) of every 4th block's first thread, for each
phase of each layer (the kernel lab; lab.py says how to make the variant file).

    python benches/kernel_lab/stamps.py FOLDER LAB_CU [MACROS...]

Per phase, medians over layers 1-27, the stamped blocks and 7 runs, in microseconds: the A operand
loaded ("A load": forced complete by a branch on the loaded values; for gate-up it includes the
norm's arithmetic, for attention + O it is the attention), the products ("products": for
attention + O, O's products and atomics), the epilogue, the grid barrier, the first thread's waits
for weight chunks inside the phase, and the phase in all. The stamps slow the kernel by 4-7%."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from lab import Lab  # noqa: E402

PHASES = ["QKV", "attention + O", "gate-up", "down"]
FIELDS = 6  # start, products' end, epilogue's end, barrier's end, weight waits, A loaded
STAMPED = 32  # blocks 0, 4, ..., 124


def main() -> None:
    lab = Lab(Path(sys.argv[1]))
    macros = sys.argv[3:]
    plain = lab.compile(sys.argv[2], macros)
    stamped = lab.compile(sys.argv[2], [*macros, "STAMPS=1"])
    layers = len(lab.model.layers)
    records, times = [], {"plain": [], "stamped": []}
    for _ in range(7):
        times["plain"].append(lab.milliseconds(plain))
        times["stamped"].append(lab.milliseconds(stamped))
        flat = lab.scratch(2).view(torch.int32).flatten()
        records.append(flat[: STAMPED * layers * 4 * FIELDS].cpu().numpy().astype(np.int64))
    r = np.stack(records).reshape(-1, STAMPED, layers * 4, FIELDS)
    stamped_ms = statistics.median(times["stamped"])
    cycles_per_us = np.median(r[:, :, -1, 3]) / (stamped_ms * 1000)
    print(f"kernel ms, median of 7: {statistics.median(times['plain']):.4f} plain, {stamped_ms:.4f} stamped")
    print(f"clock: {cycles_per_us:.0f} cycles a microsecond (the last stamp over the stamped launch's time)")
    print("| phase | A load | products | epilogue | barrier | weight waits | phase |\n|---|---|---|---|---|---|---|")

    def us(cycles: np.ndarray) -> float:
        return float(np.median(cycles)) / cycles_per_us

    for k, name in enumerate(PHASES):
        index = np.arange(1, layers) * 4 + k
        x, before = r[:, :, index, :], r[:, :, index - 1, 3]
        parts = [x[..., 5] - x[..., 0], x[..., 1] - x[..., 5], x[..., 2] - x[..., 1], x[..., 3] - x[..., 2]]
        parts += [x[..., 4], x[..., 3] - before]
        print(f"| {name} | " + " | ".join(f"{us(p):.2f}" for p in parts) + " |")
    layer = r[:, :, np.arange(1, layers) * 4 + 3, 3] - r[:, :, np.arange(0, layers - 1) * 4 + 3, 3]
    print(f"a layer: {us(layer):.2f} us")


if __name__ == "__main__":
    main()
