"""Start-up work a server does on a thread while its main thread imports torch.

`import torch` takes about 1.1 s on the H200's host; then the engine creates the CUDA context
(0.1-0.3 s) and, before its first Triton kernel, Triton hashes its own installation for its
cache keys (0.36 s). Neither needs torch: the driver's calls made through ctypes and the hashing
let go of the GIL, so both run while torch imports, and torch later finds the device's primary
context (the one its runtime uses) already made. Nothing here imports torch."""

from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger(__name__)
_triton_lock = threading.Lock()


def device_index(device: str) -> int | None:
    """The CUDA ordinal a --device value names, or None for the CPU. "auto" is GPU 0 if any."""
    device = device.strip().lower()
    if device in ("auto", "cuda", "gpu"):
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    return None


def start(device: str) -> threading.Thread | None:
    """Starts making `device`'s primary CUDA context, then Triton's key, on a daemon thread; does
    nothing for the CPU, and quietly nothing without a CUDA driver or device (torch reports those)."""
    index = device_index(device)
    if index is None:
        return None
    thread = threading.Thread(target=_prepare, args=(index,), name="rose-prestart", daemon=True)
    thread.start()
    return thread


def warm_triton() -> None:
    """Has Triton hash its installation now (once per process), so that the first kernel does
    not wait for it. A second caller waits for the first instead of hashing again."""
    with _triton_lock:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:
            return
        triton_key()


def _prepare(index: int) -> None:
    if _retain_primary_context(index):
        warm_triton()


def _retain_primary_context(index: int) -> bool:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    for call, args in (
        (driver.cuInit, (0,)),
        (driver.cuDeviceGet, (ctypes.byref(handle), index)),
        # Retained for the process's life, as torch's runtime would: it is the same context.
        (driver.cuDevicePrimaryCtxRetain, (ctypes.byref(context), handle)),
    ):
        status = call(*args)
        if status != 0:
            log.debug("prestart: %s returned %d", call.__name__, status)
            return False
    return True
