"""benches/cpu_threads.py: a busy thread's CPU time shows under its name, trailing number dropped."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benches"))
from cpu_threads import cores_busy, thread_cpu  # noqa: E402


def test_live_threads_are_grouped_by_name_without_trailing_numbers() -> None:
    ready, stop = threading.Event(), threading.Event()

    def spin() -> None:
        ready.set()
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    ready.wait()
    try:
        # Named through /proc: the name the kernel shows, as for the threads Rust names.
        (Path(f"/proc/{os.getpid()}/task/{worker.native_id}") / "comm").write_text("bench-spinner-7")
        before, start = thread_cpu(os.getpid()), time.perf_counter()
        time.sleep(1.0)
        elapsed = time.perf_counter() - start
        busy = cores_busy(before, thread_cpu(os.getpid()), elapsed)
    finally:
        stop.set()
        worker.join()
    assert "bench-spinner-7" not in busy
    assert busy.get("bench-spinner", 0) > 0.5, busy
    # /proc counts CPU time in clock ticks, and the process's total is read after its threads' in
    # each sample: the two differences may disagree by a few ticks (2.6 seen on CI).
    assert busy["total"] >= busy["bench-spinner"] - 5 / os.sysconf("SC_CLK_TCK") / elapsed, busy
