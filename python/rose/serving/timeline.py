"""How much of the time the GPU waits between steps, and when a step just enqueued should be done,
from CUDA events around each step's work."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable

import torch


class IdleShare:
    """The bookkeeping, apart from the events (so that it is testable without a GPU): steps' start
    and end times in ms, counted by window. take() closes a window and opens the next; a step
    counts in the window it was enqueued in, and the window's first step counts without the wait
    before it (that wait is the client's, not a gap between steps)."""

    def __init__(self) -> None:
        self.window = 0
        self._busy = self._span = 0.0
        self._last_end: float | None = None
        self._last_window = -1

    def add(self, start: float, end: float, window: int) -> None:
        """A finished step, enqueued in `window`."""
        if window != self.window:
            return  # enqueued before the current window opened, which reported without it
        if window != self._last_window:
            self._last_end, self._last_window = None, window
        self._busy += end - start
        # From the previous step's end: the gap before this step, then its work.
        self._span += end - (start if self._last_end is None else self._last_end)
        self._last_end = end

    def take(self) -> float | None:
        """The idle share of the steps counted since the last call (None if none); opens a new
        window. Other threads may call it: it only reads and resets numbers."""
        busy, span = self._busy, self._span
        self._busy = self._span = 0.0
        self.window += 1
        return max(0.0, 1.0 - busy / span) if span > 0 else None


class FinishForecast:
    """When a step just enqueued should be done, in time.perf_counter() seconds: from when it was
    begun (or, queued behind steps still running, the previous step's forecast end if later) plus
    the shortest span of the last few finished steps of its configuration. The shortest, because
    a late forecast makes its waiter sleep past the end while an early one only makes it poll a
    little longer (a step's span also holds the host's lateness in enqueuing it)."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._spans: dict[Hashable, deque[float]] = {}
        self._busy_until = 0.0

    def add(self, key: Hashable | None, span: float) -> None:
        """A finished step of configuration `key` took `span` seconds on the GPU (None: a step
        not to forecast from)."""
        if key is not None:
            self._spans.setdefault(key, deque(maxlen=self._keep)).append(span)

    def forecast(self, key: Hashable | None, begun: float, queued: bool) -> float | None:
        """The end of a step of `key` begun at `begun`, `queued` behind earlier steps still on the
        GPU (else it starts at once); None for key None, or before any step of `key` finished."""
        spans = self._spans.get(key) if key is not None else None
        if not spans:
            self._busy_until = 0.0  # unknown: the next step's forecast starts from its own begin
            return None
        self._busy_until = (max(begun, self._busy_until) if queued else begun) + min(spans)
        return self._busy_until


class StepTimeline:
    """Events recorded at the start and end of each step's GPU work. Only the engine's thread
    touches the events; other threads call take_idle_fraction, which reads plain numbers."""

    def __init__(self) -> None:
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int, Hashable | None]] = deque()
        self._origin: torch.cuda.Event | None = None
        self._start: torch.cuda.Event | None = None
        self._window = 0
        self.share = IdleShare()
        self.finish = FinishForecast()
        self._begun = 0.0
        # Events of collected steps, recorded again: a new one costs the host more a step.
        self._free: list[torch.cuda.Event] = []

    def begin(self, stream: torch.cuda.Stream) -> None:
        self._begun = time.perf_counter()
        if self._origin is None:  # the times of all steps are taken from this event
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record(stream)
        self._start = self._event()
        self._start.record(stream)
        self._window = self.share.window

    def end(self, stream: torch.cuda.Stream, key: Hashable | None) -> float | None:
        """Closes the step begun last, of configuration `key` (None: not to forecast); returns its
        forecast end (see FinishForecast)."""
        end = self._event()
        end.record(stream)
        self._pending.append((self._start, end, self._window, key))
        self._collect()
        return self.finish.forecast(key, self._begun, queued=len(self._pending) > 1)

    def _event(self) -> torch.cuda.Event:
        return self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)

    def _collect(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end, window, key = self._pending.popleft()
            start_ms, end_ms = self._origin.elapsed_time(start), self._origin.elapsed_time(end)
            self.share.add(start_ms, end_ms, window)
            self.finish.add(key, (end_ms - start_ms) / 1000)
            self._free += (start, end)

    def take_idle_fraction(self) -> float | None:
        """The share of GPU time spent between the steps finished since the last call."""
        return self.share.take()
