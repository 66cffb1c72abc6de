"""A server's start-up work beside the import of torch (rose.loading.prestart, rose.loading.staging), on a machine
without a GPU; tests/gpu/test_staged_weights.py stages weights on one."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rose.loading import staging
from rose.loading.prestart import device_index, release, start, take_staged
from rose.loading.staging import read_header
from rose.loading.weights import tensors_from_bytes


def test_device_values_name_their_cuda_ordinal() -> None:
    assert [device_index(d) for d in ("auto", "cuda", "CUDA:1", "cuda:12", "cpu", "cuda:x", "mps")] == [
        0, 0, 1, 12, None, None, None,
    ]  # fmt: skip


def test_the_cpu_gets_no_thread_and_a_gpu_without_a_driver_stages_nothing(tmp_path: Path) -> None:
    assert start("cpu") is None
    save_file({"w": torch.ones(2)}, tmp_path / "model.safetensors")
    thread = start("auto", tmp_path)
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()
    driver, staged = take_staged([tmp_path / "model.safetensors"], 0)
    if torch.cuda.is_available():  # staged: tests/gpu/test_staged_weights.py checks what
        assert driver is not None and list(staged) == [tmp_path / "model.safetensors"]
        release(driver, list(staged.values()))
    else:
        assert (driver, staged) == (None, {})


def test_importing_rose_and_prestart_leaves_torch_unimported() -> None:
    probe = "import sys, rose, rose.loading.prestart; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_data_section_read_by_its_header_gives_safetensors_own_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {
        "layer.weight": torch.randn(3, 5).to(torch.bfloat16),
        "ids": torch.arange(7),
        "odd_bytes": torch.arange(3, dtype=torch.uint8),  # leaves the next tensor unaligned
        "half": torch.randn(2, 2).half(),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    start, header = read_header(path)
    data = torch.frombuffer(bytearray(path.read_bytes()[start:]), dtype=torch.uint8)
    got, want = tensors_from_bytes(data, header, torch.device("cpu")), load_file(path)
    assert got.keys() == want.keys() == tensors.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


class MemoryDriver:
    """rose.loading.staging's view of the CUDA driver over host memory: allocations are bytearrays, and a
    copy reads its host chunk only when an event recorded after it is waited for (as late as a
    GPU may), so that reusing a chunk too early shows."""

    def __init__(self, free: int = 1 << 40) -> None:
        self.free_bytes, self.buffers, self.copies = free, {}, 0
        self._next, self._host, self._events = 1 << 20, None, 0
        self._pending: list[tuple[int, int, int]] = []
        self._recorded: dict[int, list[tuple[int, int, int]]] = {}

    def free_memory(self) -> int:
        return self.free_bytes

    def alloc(self, size: int) -> int:
        pointer, self._next = self._next, self._next + size + 4096
        self.buffers[pointer] = bytearray(size)
        return pointer

    def free(self, pointer: int) -> None:
        del self.buffers[pointer]

    def alloc_host(self, size: int) -> int:
        self._host = (ctypes.c_char * size)()
        return ctypes.addressof(self._host)

    def event(self) -> int:
        self._events += 1
        return self._events

    def copy_to_device(self, device: int, host: int, size: int, stream: int) -> None:
        self._pending.append((device, host, size))
        self.copies += 1

    def record(self, event: int, stream: int) -> None:
        self._recorded[event] = self._recorded.get(event, []) + self._pending
        self._pending = []

    def wait(self, event: int) -> None:
        for device, host, size in self._recorded.pop(event, []):
            base = max(p for p in self.buffers if p <= device)
            self.buffers[base][device - base : device - base + size] = ctypes.string_at(host, size)

    def free_host(self, pointer: int) -> None: ...
    def stream(self) -> int: return 1  # fmt: skip

    def destroy(self, stream: int, events: list[int]) -> None: ...


def test_staging_copies_every_file_whole_through_the_two_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging, "CHUNK_BYTES", 48)  # many chunks, and a short last one
    files = []
    for i, n in enumerate((5, 37, 1)):
        files.append(tmp_path / f"model-{i}.safetensors")
        tensors = {f"w{i}": torch.randn(n, 3), f"b{i}": torch.arange(n, dtype=torch.int32)}
        save_file({**tensors, f"z{i}": torch.arange(1, n + 2, dtype=torch.uint8)}, files[-1])  # ends non-zero
    driver = MemoryDriver()
    staged = staging.stage(driver, files)
    assert [s.path for s in staged] == files and driver.copies > len(files)
    for file in staged:
        start, _ = read_header(file.path)
        assert bytes(driver.buffers[file.pointer]) == file.path.read_bytes()[start:]
        data = torch.frombuffer(driver.buffers[file.pointer], dtype=torch.uint8)
        got, want = tensors_from_bytes(data, file.tensors, torch.device("cpu")), load_file(file.path)
        assert all(torch.equal(got[name], want[name]) for name in want)


def test_weights_the_gpu_has_no_room_for_are_not_staged(tmp_path: Path) -> None:
    save_file({"w": torch.ones(1000)}, tmp_path / "model.safetensors")
    driver = MemoryDriver(free=5000)  # less than three times the 4 kB of weights
    with pytest.raises(MemoryError):
        staging.stage(driver, [tmp_path / "model.safetensors"])
    assert not driver.buffers
