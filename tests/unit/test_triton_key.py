"""rose.loading.triton_key: the fingerprint follows the files Triton's key covers, and a stored key is the
one Triton then uses (in fresh interpreters, as a server's start)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rose.loading import triton_key

pytest.importorskip("triton")


def test_the_fingerprint_changes_with_a_covered_file_only(tmp_path: Path) -> None:
    for name in ("__init__.py", "runtime/cache.py", "compiler/code.py", "_C/libtriton.so", "tools/other.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    first = triton_key.fingerprint(tmp_path)
    assert triton_key.fingerprint(tmp_path) == first
    os.utime(tmp_path / "tools/other.py", ns=(1, 1))  # not hashed by Triton
    assert triton_key.fingerprint(tmp_path) == first
    os.utime(tmp_path / "_C/libtriton.so", ns=(1, 1))
    assert triton_key.fingerprint(tmp_path) != first


def _start(cache: Path) -> str:
    """What a fresh process's triton.runtime.cache.triton_key() gives after warm_triton()."""
    code = "from rose.loading import prestart; prestart.warm_triton(); from triton.runtime import cache\n"
    code += "print(cache.triton_key())"
    env = {**os.environ, "ROSE_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout


def test_a_start_stores_triton_s_key_and_a_later_one_uses_it(tmp_path: Path) -> None:
    computed = _start(tmp_path)  # hashed, as Triton does, and stored
    stored = tmp_path / "triton-key" / str(triton_key.fingerprint())
    assert stored.read_text() + "\n" == computed
    stored.write_text("stored-key")  # a later start takes it instead of hashing
    assert _start(tmp_path) == "stored-key\n"
