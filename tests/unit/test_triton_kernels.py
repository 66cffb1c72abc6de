"""ROSE's Triton kernels (fused QK-norm and RoPE, small-batch attention; the others where
FlashInfer is missing or wrong) match the torch reference, checked on the CPU through Triton's interpreter in a process
of its own (the interpreter is chosen when Triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def interpreted(script: str) -> str:
    """stdout of tests/unit/`script` run under Triton's interpreter; fails the test if the script fails."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    path = Path(__file__).with_name(script)
    result = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_triton_kernels_match_the_torch_reference() -> None:
    assert "triton kernels match" in interpreted("check_triton_kernels.py")


def test_fused_decoder_matches_the_layer_by_layer_path() -> None:
    assert "fused decoder matches" in interpreted("check_fused_decoder.py")
