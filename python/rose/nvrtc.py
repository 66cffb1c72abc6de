"""CUDA C++ compiled at run time by NVRTC (the library torch's CUDA wheels carry) into a cubin for
the device, kept on disk under a key of the source, the options and NVRTC's version, so that a
later start only reads it. Through ctypes; nothing here imports torch."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import sys
from functools import cache
from pathlib import Path

from rose.cache import cache_dir


class NvrtcError(RuntimeError):
    """NVRTC is missing, or the source did not compile (the message holds NVRTC's log)."""


@cache
def _library() -> ctypes.CDLL:
    for root in sys.path:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so.*")))
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")))
        for path in found:
            # libnvrtc opens its builtins by name: loaded first, they are found.
            for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
    name = ctypes.util.find_library("nvrtc")
    if name is None:
        raise NvrtcError("libnvrtc not found (it comes with torch's CUDA wheels)")
    return ctypes.CDLL(name)


def version() -> tuple[int, int]:
    """NVRTC's (major, minor)."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NvrtcError(f"{what} returned NVRTC error {status}")


def compile_cubin(source: str, name: str, arch: int, options: list[str]) -> bytes:
    """The cubin of `source` for sm_{arch} (such as 90), from the cache when it has it."""
    options = [f"--gpu-architecture=sm_{arch}", "-default-device", "-std=c++17", *options]
    key = hashlib.sha256("\0".join([source, *options, repr(version())]).encode()).hexdigest()[:24]
    path = cache_dir("nvrtc", f"{name}-{key}.cubin")
    if path.exists():
        return path.read_bytes()
    cubin = _compile(source, name, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(cubin)
    partial.replace(path)
    return cubin


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


def source(name: str) -> str:
    """A .cu file of the rose package."""
    return (Path(__file__).parent / name).read_text()
