"""How much of the time the GPU waits between steps, from CUDA events around each step's work."""

from __future__ import annotations

from collections import deque

import torch


class StepTimeline:
    """Events recorded at the start and end of each step's GPU work."""

    def __init__(self, keep: int = 1024) -> None:
        self._steps: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque(maxlen=keep)
        self._start: torch.cuda.Event | None = None

    def begin(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def end(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._steps.append((self._start, end))

    def take_idle_fraction(self) -> float | None:
        """The share of time between the first and the last finished step since the last call
        that the GPU spent between steps; those steps are then forgotten."""
        done = []
        while self._steps and self._steps[0][1].query():
            done.append(self._steps.popleft())
        if len(done) < 2:
            return None
        busy = sum(start.elapsed_time(end) for start, end in done)
        span = done[0][0].elapsed_time(done[-1][1])
        return max(0.0, 1.0 - busy / span) if span > 0 else None
