"""Where a process's cores go: CPU time of its threads from /proc (Linux), grouped by thread name.

Ivy, Tulip and ROSE name their threads (ivy-tokenizer-N, ivy-tulip, tulip-engine, tulip-waiter),
so a run's CPU splits into tokenization, the async runtime (HTTP, JSON, gRPC), the engine (with
torch's CPU threads, which it starts and which take its name) and the rest; this says whether
the harness is short of cores.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(stat: str) -> float:
    # utime and stime are fields 14 and 15; the name in brackets may itself hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of `pid`'s live threads per name, trailing numbers dropped (ivy-tokenizer-3
    counts as ivy-tokenizer), and "total" for the whole process, its ended threads included."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            seconds = _cpu_seconds((task / "stat").read_text())
        except OSError:  # the thread ended meanwhile
            continue
        group = re.sub(r"[-_]?\d+$", "", name) or name
        out[group] = out.get(group, 0.0) + seconds
    out["total"] = _cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    return out


def cores_busy(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores kept busy over `seconds` per thread group, busiest first, "total" last."""
    busy = {k: (v - before.get(k, 0.0)) / seconds for k, v in after.items() if k != "total"}
    ranked = dict(sorted(((k, v) for k, v in busy.items() if v >= 0.005), key=lambda kv: -kv[1]))
    ranked["total"] = (after["total"] - before.get("total", 0.0)) / seconds
    return ranked


def describe(busy: dict[str, float]) -> str:
    """ "ivy-tokenizer 7.90, ivy-tulip 3.10, ... (total 12.60)"."""
    parts = ", ".join(f"{k} {v:.2f}" for k, v in busy.items() if k != "total")
    return f"{parts} (total {busy['total']:.2f})"
