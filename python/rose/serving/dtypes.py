"""Which device and dtypes an engine runs in, from its flags' values."""

from __future__ import annotations

import logging

import torch

from rose.errors import ModelError
from rose.ops.fp8 import FP8, supported

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
MIXED = "mixed"
"""bfloat16 matmuls (float32 accumulation), float32 activations, norms and attention."""
FP8_NAME = "fp8"
"""e4m3 matmuls (rose.ops.fp8), bfloat16 activations, norms and attention; a dtype, not a
separate quantization flag, because like `mixed` it names which arithmetic the matmuls and
the activations run in, for a 16-bit checkpoint quantized at load."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" is the GPU when there is one, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as why:
        raise ModelError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from why


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """The activations' and the matmuls' dtypes. "auto" is bfloat16 on the GPU and float32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype, dtype
    if dtype == MIXED:
        if device.type == "cpu" and not cpu_has_bfloat16():
            # Without bfloat16 instructions the CPU converts every operand: slower than float32.
            log.warning("--dtype mixed needs a CPU with bfloat16 instructions (AVX512-BF16 or AMX); using float32")
            return torch.float32, torch.float32
        return torch.float32, torch.bfloat16
    if dtype == FP8_NAME:
        if not supported(device):
            # The CPU and older GPUs emulate the products (the tests' path): slower than float32.
            log.warning("--dtype fp8 is emulated on %s (FP8 matmuls need compute capability 8.9+)", device)
        return (torch.bfloat16 if device.type == "cuda" else torch.float32), FP8
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use auto, {MIXED}, {FP8_NAME}, {', '.join(DTYPES)}")
    return DTYPES[dtype], DTYPES[dtype]


def dtype_name(dtype: torch.dtype, matmul_dtype: torch.dtype) -> str:
    """How /info names the pair."""
    if matmul_dtype == FP8:
        return f"{FP8_NAME} (e4m3 matmuls, {_name(dtype)} activations)"
    if matmul_dtype != dtype:
        return f"{MIXED} ({_name(matmul_dtype)} matmuls, {_name(dtype)} activations)"
    return _name(dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cpu_has_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (x86's AVX512-BF16 or AMX; Arm's BF16)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_arm_sve_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
