"""A model's safetensors files copied onto the GPU by the CUDA driver while torch imports (see
rose.loading.prestart); the engine then takes its tensors from device memory (rose.loading.weights) instead of
reading the files with the slower pageable copies of safetensors' loader. Nothing here imports
torch."""

from __future__ import annotations

import ctypes
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rose.runtime.cuda_driver import CudaDriver

CHUNK_BYTES = 32 << 20


@dataclass
class StagedFile:
    """One safetensors file's data section in device memory at `pointer`, and its header."""

    path: Path
    pointer: int
    size: int
    tensors: dict[str, dict[str, Any]]  # name -> dtype, shape, data_offsets within the section


def read_header(path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """Where a safetensors file's data section starts, and its tensors' entries: the format is an
    8-byte little-endian header length, the JSON header, then the data."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


def stage(driver: CudaDriver, files: list[Path]) -> list[StagedFile]:
    """Copies each file's data section into a device buffer of its own, through two page-locked
    chunks, so that reading a chunk from the file overlaps copying the one before."""
    parsed = [(path, *read_header(path)) for path in files]
    sizes = [path.stat().st_size - start for path, start, _ in parsed]
    # The engine copies the tensors out of these buffers before it frees them, so the weights are
    # on the GPU twice for a moment; leave as much again for the rest.
    if 3 * sum(sizes) > driver.free_memory():
        raise MemoryError(f"{sum(sizes)} bytes of weights leave too little room to stage them")
    host, stream, events = driver.alloc_host(2 * CHUNK_BYTES), driver.stream(), [driver.event(), driver.event()]
    staged: list[StagedFile] = []
    chunk = 0
    try:
        for (path, start, header), size in zip(parsed, sizes, strict=True):
            staged.append(StagedFile(path, driver.alloc(max(size, 1)), size, header))
            with path.open("rb", buffering=0) as file:
                file.seek(start)
                for offset in range(0, size, CHUNK_BYTES):
                    slot, length = chunk % 2, min(CHUNK_BYTES, size - offset)
                    driver.wait(events[slot])  # the copy out of this slot two chunks ago
                    buffer = (ctypes.c_char * length).from_address(host + slot * CHUNK_BYTES)
                    _read_exactly(file, memoryview(buffer).cast("B"))
                    driver.copy_to_device(staged[-1].pointer + offset, host + slot * CHUNK_BYTES, length, stream)
                    driver.record(events[slot], stream)
                    chunk += 1
    except BaseException:
        _drain(driver, events)  # no copy may still write into the buffers when they go
        for done in staged:
            driver.free(done.pointer)
        raise
    finally:
        _drain(driver, events)  # nor read the host chunks
        driver.free_host(host)
        driver.destroy(stream, events)
    return staged


def _drain(driver: CudaDriver, events: list[int]) -> None:
    for event in events:
        driver.wait(event)


def _read_exactly(file: BinaryIO, into: memoryview) -> None:
    got = 0
    while got < len(into):
        n = file.readinto(into[got:])
        if not n:
            raise EOFError(f"{file.name} ends inside its data")
        got += n
