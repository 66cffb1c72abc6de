"""How much of the time the GPU waits between steps, from CUDA events around each step's work."""

from __future__ import annotations

from collections import deque

import torch


class StepTimeline:
    """Events recorded at the start and end of each step's GPU work. Only the engine's thread
    touches the events; other threads read plain numbers."""

    def __init__(self) -> None:
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self._start: torch.cuda.Event | None = None
        self._last_end: torch.cuda.Event | None = None
        self._busy_ms = 0.0
        self._span_ms = 0.0
        self._restart = False

    def begin(self, stream: torch.cuda.Stream) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record(stream)

    def end(self, stream: torch.cuda.Stream) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        self._pending.append((self._start, end))
        self._collect()

    def _collect(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            if self._restart:
                self._last_end, self._restart = None, False
            busy = start.elapsed_time(end)
            self._busy_ms += busy
            # From the previous step's end: the gap before this step, then its work.
            self._span_ms += self._last_end.elapsed_time(end) if self._last_end is not None else busy
            self._last_end = end

    def take_idle_fraction(self) -> float | None:
        """The share of GPU time spent between the steps finished since the last call."""
        busy, span = self._busy_ms, self._span_ms
        self._busy_ms = self._span_ms = 0.0
        # The next window starts with the next step: the wait before it is the client's, not a
        # gap between steps. A flag, since _last_end belongs to the engine's thread.
        self._restart = True
        return max(0.0, 1.0 - busy / span) if span > 0 else None
