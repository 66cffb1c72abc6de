"""The C heap's trimming thread (rose.runtime.heap), on this Linux/glibc machine."""

from __future__ import annotations

import threading

from rose.runtime import heap


def test_the_trimming_thread_runs_once_a_process() -> None:
    assert heap.start_trimming() and heap.start_trimming()
    assert [t.name for t in threading.enumerate()].count("rose-heap-trim") == 1
