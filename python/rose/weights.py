"""Loading safetensors weights as published, whatever prefix their names carry."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def load_weights(
    root: Path, prefixes: tuple[str, ...] = (), device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """All tensors of the folder's *.safetensors files on `device`, with any of `prefixes` stripped."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file), device=str(device)).items():
            for prefix in prefixes:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            weights[name] = tensor
    return weights
