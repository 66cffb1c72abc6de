"""Work on a daemon thread, awaited through a Future: start-up's slow imports and warm-ups, and
kernels loaded while the engine serves. Daemon, so that a process exits without waiting for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def in_background(work: Callable[[], T], name: str = "rose-background") -> Future[T]:
    """Runs `work` on a daemon thread named `name`; the future holds its result or its exception."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as why:  # noqa: BLE001 - handed to whoever looks at the future
            future.set_exception(why)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
