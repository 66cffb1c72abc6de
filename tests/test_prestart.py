"""A server's start-up work beside the import of torch (rose.prestart, rose.staging), on a machine
without a GPU; tests/gpu/test_staged_weights.py stages weights on one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rose.prestart import device_index, release, start, take_staged
from rose.staging import read_header
from rose.weights import tensors_from_bytes


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
    probe = "import sys, rose, rose.prestart; print('torch' in sys.modules)"
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
