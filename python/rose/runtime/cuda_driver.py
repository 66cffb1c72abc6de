"""The few CUDA driver calls that a server's start makes before torch is imported (rose.loading.prestart),
and the loading and launching of rose's own CUDA kernels (rose.decoder.cuda), through ctypes: each
call lets go of the GIL while it runs. Nothing here imports torch."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache
from typing import Any

_NON_BLOCKING_STREAM = 1
_EVENT_DISABLE_TIMING = 2
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_MULTIPROCESSOR_COUNT = 16
_COMPUTE_CAPABILITY_MAJOR = 75
_COMPUTE_CAPABILITY_MINOR = 76


class CudaError(RuntimeError):
    """A driver call that did not return CUDA_SUCCESS."""


class CudaDriver:
    """libcuda, with the device's primary context (the one torch's runtime uses) current on the
    calling thread. Pointers are plain ints."""

    def __init__(self, index: int) -> None:
        """Raises OSError without a driver, CudaError without the device."""
        self._lib = ctypes.CDLL("libcuda.so.1")
        handle, self.context = ctypes.c_int(), ctypes.c_void_p()
        self._call("cuInit", 0)
        self._call("cuDeviceGet", ctypes.byref(handle), index)
        self._device = handle
        # Retained for the process's life, as torch's runtime would: it is the same context.
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), handle)
        self.make_current()

    def make_current(self) -> None:
        """Makes the context current on the calling thread (the driver's calls need one)."""
        self._call("cuCtxSetCurrent", self.context)

    def _call(self, name: str, *args: Any) -> None:
        function: Callable[..., int] = getattr(self._lib, name)
        status = function(*args)
        if status != 0:
            raise CudaError(f"{name} returned CUDA error {status}")

    def _attribute(self, attribute: int) -> int:
        value = ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(value), attribute, self._device)
        return value.value

    def arch(self) -> int:
        """The device's compute capability as NVRTC names it: 90 for sm_90."""
        return self._attribute(_COMPUTE_CAPABILITY_MAJOR) * 10 + self._attribute(_COMPUTE_CAPABILITY_MINOR)

    def sm_count(self) -> int:
        return self._attribute(_MULTIPROCESSOR_COUNT)

    def free_memory(self) -> int:
        """Bytes free on the device."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value

    def alloc(self, size: int) -> int:
        """Device memory; give it back with free()."""
        pointer = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        return pointer.value

    def free(self, pointer: int) -> None:
        self._call("cuMemFree_v2", ctypes.c_uint64(pointer))

    def alloc_host(self, size: int) -> int:
        """Page-locked host memory, which the GPU copies from asynchronously; see free_host()."""
        pointer = ctypes.c_void_p()
        self._call("cuMemAllocHost_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        assert pointer.value is not None
        return pointer.value

    def free_host(self, pointer: int) -> None:
        self._call("cuMemFreeHost", ctypes.c_void_p(pointer))

    def stream(self) -> int:
        stream = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(stream), _NON_BLOCKING_STREAM)
        return stream.value or 0

    def event(self) -> int:
        event = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(event), _EVENT_DISABLE_TIMING)
        return event.value or 0

    def copy_to_device(self, device: int, host: int, size: int, stream: int) -> None:
        """Enqueues a host-to-device copy on `stream`."""
        self._call(
            "cuMemcpyHtoDAsync_v2",
            ctypes.c_uint64(device),
            ctypes.c_void_p(host),
            ctypes.c_size_t(size),
            ctypes.c_void_p(stream),
        )

    def launch_graph(self, graph_exec: int, stream: int) -> None:
        """Enqueues an instantiated CUDA graph (a cudaGraphExec_t) on `stream`."""
        self._call("cuGraphLaunch", ctypes.c_void_p(graph_exec), ctypes.c_void_p(stream))

    def record(self, event: int, stream: int) -> None:
        self._call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait(self, event: int) -> None:
        self._call("cuEventSynchronize", ctypes.c_void_p(event))

    def load_function(self, cubin: bytes, name: str, shared: int) -> int:
        """The kernel `name` of a cubin, allowed `shared` bytes of dynamic shared memory."""
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), cubin)
        self._call("cuModuleGetFunction", ctypes.byref(function), module, name.encode())
        self._call("cuFuncSetAttribute", function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        return function.value or 0

    def launch(self, function: int, grid: int, block: int, shared: int, stream: int, args: list) -> None:
        """Enqueues a kernel on `stream` (recorded when the stream is capturing a graph); `args` are
        ctypes values in the kernel's parameter order."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(arg), ctypes.c_void_p) for arg in args])
        self._call(
            "cuLaunchKernel", ctypes.c_void_p(function), grid, 1, 1, block, 1, 1, shared, ctypes.c_void_p(stream),
            params, None,
        )  # fmt: skip

    def destroy(self, stream: int, events: list[int]) -> None:
        for event in events:
            self._call("cuEventDestroy_v2", ctypes.c_void_p(event))
        self._call("cuStreamDestroy_v2", ctypes.c_void_p(stream))


def driver_for(index: int) -> CudaDriver:
    """The process's CudaDriver of device `index`, its context made current on the calling thread:
    one for the engine's users (each new one would retain the context again)."""
    driver = _drivers(index)
    driver.make_current()
    return driver


@cache
def _drivers(index: int) -> CudaDriver:
    return CudaDriver(index)
