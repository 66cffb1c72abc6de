"""LazyTensor: a step's result that may still be travelling from the device to the host."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import numpy as np
import torch

# A waiter with a forecast end sleeps until a little before it, then looks every few us, for a
# while, before it falls back to the blocking wait. Woken by the GPU's interrupt from a sleeping
# core, a blocking wait returns a tenth of a millisecond or so later than a spinning one; waking
# just before the end keeps that off the result's path without spinning through the step. Both margins
# grow with the time left: a longer sleep wakes later (a deeper idle state), and a longer step's
# end varies more; the early one is capped, or a long batch's waiter would poll for milliseconds.
_WAKE_EARLY = 0.15  # of the time left at the call
_WAKE_EARLY_MIN_S = 30e-6
_WAKE_EARLY_MAX_S = 200e-6
_POLL_FOR = 0.25  # past the forecast end, of the time left at the call
_POLL_FOR_S = 100e-6  # at least
_POLL_S = 5e-6
_PR_SET_TIMERSLACK = 29
_thread = threading.local()


class LazyTensor:
    """A page-locked host buffer, the asynchronous copy filling it, and the event that marks its end.

    step() returns one at once; whoever needs the values calls wait(), which blocks only that
    caller (torch releases the GIL while it waits on the event).
    """

    def __init__(self, host: torch.Tensor, done: torch.cuda.Event | None = None) -> None:
        self._host = host
        self._done = done
        self.ready_at: float | None = None
        """When the values should be on the host (time.perf_counter()), if the engine knows."""

    @classmethod
    def from_device(
        cls, values: torch.Tensor, copy_stream: torch.cuda.Stream | None = None, stream: torch.cuda.Stream | None = None
    ) -> LazyTensor:
        """Starts copying `values`, made on `stream`, to the host; on the CPU the result is
        complete at once. `stream` must be the caller's current stream (None: looked up), which
        is current again on return."""
        if values.device.type == "cpu":
            return cls(values.contiguous())
        assert copy_stream is not None, "a device result needs a copy stream"
        stream = stream or torch.cuda.current_stream(values.device)
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        copy_stream.wait_stream(stream)
        # set_stream rather than `with torch.cuda.stream()`, which looks the current stream up
        # again: host time on a short query's path.
        torch.cuda.set_stream(copy_stream)
        try:
            host.copy_(values, non_blocking=True)
            # The compute stream may reuse `values` once the copy that reads it is done.
            values.record_stream(copy_stream)
            # Blocking: a waiter sleeps until the copy is done instead of spinning on a core.
            done = torch.cuda.Event(blocking=True)
            done.record(copy_stream)
        finally:
            torch.cuda.set_stream(stream)
        return cls(host, done)

    @classmethod
    def joined(cls, parts: list[LazyTensor]) -> LazyTensor:
        """One complete result of several, their rows in order (waits for each)."""
        return cls(torch.from_numpy(np.concatenate([part.wait() for part in parts])))

    @property
    def done(self) -> torch.cuda.Event | None:
        """The event that marks the end of the copy (None on the CPU)."""
        return self._done

    def ready(self) -> bool:
        """True once the values are on the host."""
        return self._done is None or self._done.query()

    def wait(self) -> np.ndarray:
        """Blocks until the values are on the host; returns them (float32 [rows, dim]). With a
        forecast end (ready_at), sleeps until just before it and polls a while first."""
        done = self._done
        if done is not None and self.ready_at is not None and not done.query():
            left = self.ready_at - time.perf_counter()
            early = min(max(_WAKE_EARLY * left, _WAKE_EARLY_MIN_S), _WAKE_EARLY_MAX_S)
            _sleep(left - early)
            give_up = self.ready_at + max(_POLL_FOR * left, _POLL_FOR_S)
            while not done.query() and time.perf_counter() < give_up:
                _sleep(_POLL_S)
        if done is not None:
            done.synchronize()  # releases the GIL
        return self._host.numpy()


def _sleep(seconds: float) -> None:
    """time.sleep, to within a few us: Linux lets a thread's timed sleeps run late by its timer
    slack, 50 us unless the thread sets it lower."""
    if seconds <= 0:
        return
    if not getattr(_thread, "slack_set", False):
        _thread.slack_set = True
        if sys.platform == "linux":
            ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # 1 us
    time.sleep(seconds)
