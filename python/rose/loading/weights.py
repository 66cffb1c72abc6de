"""Loading safetensors weights as published, whatever prefix their names carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rose.errors import ModelError
from rose.loading import prestart
from rose.loading.model_dir import weight_files
from rose.loading.staging import StagedFile

# safetensors' dtype names (its format's header).
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def load_weights(
    root: Path, prefixes: tuple[str, ...] = (), device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """All tensors of the folder's *.safetensors files on `device`, with any of `prefixes`
    stripped. Files that rose.loading.prestart already copied onto that GPU are taken from there."""
    files = weight_files(root)
    if not files:
        raise ModelError(f"{root} has no *.safetensors weights")
    device = torch.device(device)
    driver, staged = None, {}
    if device.type == "cuda":
        driver, staged = prestart.take_staged(files, device.index or 0)
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        tensors = _from_staged(staged[file], device) if file in staged else load_file(str(file), device=str(device))
        for name, tensor in tensors.items():
            for prefix in prefixes:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            weights[name] = tensor
    if driver is not None:
        torch.cuda.synchronize(device)  # the copies out of the staged buffers are done
        prestart.release(driver, list(staged.values()))
    return weights


def tensors_from_bytes(
    data: torch.Tensor, header: dict[str, dict[str, Any]], device: torch.device
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors data section (`data`: uint8, on any device) as described by
    its header, each copied into memory of its own on `device`."""
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        tensor = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]], device=device)
        tensor.view(-1).view(torch.uint8).copy_(data[begin:end])
        out[name] = tensor
    return out


class _DeviceBytes:
    """Device memory that torch can view without copying (the CUDA array interface)."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (pointer, False), "version": 3}


def _from_staged(staged: StagedFile, device: torch.device) -> dict[str, torch.Tensor]:
    data = torch.as_tensor(_DeviceBytes(staged.pointer, staged.size), device=device)
    return tensors_from_bytes(data, staged.tensors, device)
