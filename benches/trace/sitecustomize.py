"""Loaded by the ivy-serve that benches/rerank_timeline.py starts (this folder first on its
PYTHONPATH): writes each engine step's host enqueue span, its GPU span (CUDA events, in the host's
perf_counter clock) and its waiter's return to $ROSE_TRACE, one JSON line each. Bench-only: the
server itself reads no such variable."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


def _install(path: str) -> None:
    import torch

    from rose.batch import as_int32
    from rose.serving import engine, lazy, timeline

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    lock = threading.Lock()

    def log(**fields: Any) -> None:
        with lock:
            out.write(json.dumps(fields) + "\n")

    step = engine.Engine.step

    def traced_step(self, input_ids, cu_seqlens, token_type_ids=None, per_token=False):  # noqa: ANN001, ANN202
        began = time.perf_counter()
        result = step(self, input_ids, cu_seqlens, token_type_ids, per_token)
        log(ev="step", t0=began, t1=time.perf_counter(), tokens=len(as_int32(input_ids)),
            seqs=len(as_int32(cu_seqlens)) - 1)  # fmt: skip
        return result

    wait = lazy.LazyTensor.wait

    def traced_wait(self):  # noqa: ANN001, ANN202
        began = time.perf_counter()
        values = wait(self)
        log(ev="wait", t0=began, t1=time.perf_counter(), ready_at=self.ready_at)
        return values

    anchor: dict[str, Any] = {}
    collect = timeline.StepTimeline._collect

    def traced_collect(self):  # noqa: ANN001, ANN202
        if not anchor:  # an event whose host time is known: every step's events are timed from it
            torch.cuda.synchronize()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
            anchor.update(event=event, host=time.perf_counter())
        for start, end, _, key in self._pending:
            if not end.query():
                break
            at = lambda e: anchor["host"] + anchor["event"].elapsed_time(e) / 1e3  # noqa: E731
            log(ev="gpu", g0=at(start), g1=at(end), key=str(key))
        return collect(self)

    engine.Engine.step = traced_step
    lazy.LazyTensor.wait = traced_wait
    timeline.StepTimeline._collect = traced_collect


if os.environ.get("ROSE_TRACE"):
    _install(os.environ["ROSE_TRACE"])
