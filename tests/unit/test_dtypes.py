"""The dtype a --dtype value runs in, on this machine."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rose.serving import dtypes


def test_auto_is_float32_on_the_cpu() -> None:
    assert dtypes.resolve_dtype("auto", torch.device("cpu")) == (torch.float32, torch.float32)


def test_mixed_falls_back_to_float32_without_bfloat16_instructions(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dtypes, "cpu_has_bfloat16", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert dtypes.resolve_dtype("mixed", torch.device("cpu")) == (torch.float32, torch.float32)
    assert "bfloat16 instructions" in caplog.text
    monkeypatch.setattr(dtypes, "cpu_has_bfloat16", lambda: True)
    assert dtypes.resolve_dtype("mixed", torch.device("cpu")) == (torch.float32, torch.bfloat16)


def test_this_cpus_bfloat16_support_matches_its_flags() -> None:
    flags = Path("/proc/cpuinfo").read_text().split()
    expected = "avx512_bf16" in flags or "amx_bf16" in flags
    assert dtypes.cpu_has_bfloat16() == expected
