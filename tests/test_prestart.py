"""A server's start-up work beside the import of torch (rose.prestart), on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys

from rose.prestart import device_index, start


def test_device_values_name_their_cuda_ordinal() -> None:
    assert [device_index(d) for d in ("auto", "cuda", "CUDA:1", "cuda:12", "cpu", "cuda:x", "mps")] == [
        0, 0, 1, 12, None, None, None,
    ]  # fmt: skip


def test_the_cpu_gets_no_thread_and_a_missing_driver_is_quiet() -> None:
    assert start("cpu") is None
    thread = start("auto")
    assert thread is not None
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_importing_rose_and_prestart_leaves_torch_unimported() -> None:
    probe = "import sys, rose, rose.prestart; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
