"""CUDA C++ compiled at run time by NVRTC (the library torch's CUDA wheels carry) into a cubin for
the device, kept on disk under a key of the source, the options and the NVRTC library file, so that a
later start only reads it. Through ctypes; nothing here imports torch."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import sys
import threading
from concurrent.futures import Future
from functools import cache

from rose.runtime.cache import cache_dir, write_whole


class NvrtcError(RuntimeError):
    """NVRTC is missing, or the source did not compile (the message holds NVRTC's log)."""


@cache
def _library_path() -> str:
    """The libnvrtc that torch's CUDA wheels installed (or the system's), found without loading it."""
    for root in sys.path:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.*")))
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")))
        if found:
            return found[0]
    name = ctypes.util.find_library("nvrtc")
    if name is None:
        raise NvrtcError("libnvrtc not found (it comes with torch's CUDA wheels)")
    return name


@cache
def _library() -> ctypes.CDLL:
    path = _library_path()
    # libnvrtc opens its builtins by name: loaded first, they are found.
    for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


def _fingerprint() -> str:
    """Which NVRTC a cached cubin came from: its file, size and time (loading the library to ask
    its version would cost every start more than the rest of this lookup)."""
    path = _library_path()
    try:
        stat = os.stat(path)
    except OSError:  # a bare name from find_library
        return path
    return f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NvrtcError(f"{what} returned NVRTC error {status}")


# Compiles under way, by cache key: a second caller (the engine, while rose.loading.prestart's thread
# compiles the same kernel) waits for the first instead of compiling it again.
_compiling: dict[str, Future[bytes]] = {}
_compiling_lock = threading.Lock()


def compile_cubin(source: str, name: str, arch: int, options: list[str]) -> bytes:
    """The cubin of `source` for sm_{arch} (such as 90), from the cache when it has it."""
    options = [f"--gpu-architecture=sm_{arch}", "-default-device", "-std=c++17", *options]
    key = hashlib.sha256("\0".join([source, *options, _fingerprint()]).encode()).hexdigest()[:24]
    path = cache_dir("nvrtc", f"{name}-{key}.cubin")
    with _compiling_lock:
        underway = _compiling.get(key)
        if underway is None:
            if path.exists():
                return path.read_bytes()
            mine = _compiling[key] = Future()
    if underway is not None:
        return underway.result()
    try:
        cubin = _compile(source, name, options)
        try:
            write_whole(path, lambda out: out.write(cubin))
        except OSError:  # a read-only cache: compile again next time
            pass
        mine.set_result(cubin)
        return cubin
    except BaseException as why:
        mine.set_exception(why)
        raise
    finally:
        with _compiling_lock:
            del _compiling[key]


def _compile(source: str, name: str, options: list[str]) -> bytes:
    lib = _library()
    program = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None),
           "nvrtcCreateProgram")  # fmt: skip
    try:
        encoded = [option.encode() for option in options]
        status = lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        if status != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            raise NvrtcError(f"{name} did not compile:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
