"""The C heap's growth under torch on the CPU. glibc raises its mmap threshold each time a large
block is freed, so the activations of later steps (megabytes, of sizes that vary with every
batch) come from the heap, which fragments: a server's resident memory grew by a gigabyte in
minutes of mixed batches (benches/soak.py), freed memory that glibc kept. A thread hands the
heap's free pages back to the system every few seconds (malloc_trim); fixing the threshold
instead kept the memory flat but cost a third of the CPU's batch throughput (page faults)."""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import threading
import time

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 5.0
"""How often the free pages go back: a trim takes about a millisecond."""


@functools.cache
def start_trimming() -> bool:
    """Starts the trimming thread (once a process); False where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError) as why:
        log.info("cannot trim the C heap: %s", why)
        return False

    def run() -> None:
        while True:
            time.sleep(TRIM_INTERVAL_S)
            trim(0)

    threading.Thread(target=run, name="rose-heap-trim", daemon=True).start()
    return True
