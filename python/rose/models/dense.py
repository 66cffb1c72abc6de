"""sentence-transformers' Dense modules after pooling (EmbeddingGemma's 768 -> 3072 -> 768, for
one), read from their folders as published: `config.json` and the `linear` weights. They run in
float32 after the forward pass, as score heads do (the fidelity check compares the pooled states)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from rose.errors import ModelError


class DenseModules:
    """The Dense modules in order: y = activation(W x + b) each."""

    def __init__(self, folders: list[Path], device: torch.device) -> None:
        self.layers = []
        for folder in folders:
            config = json.loads((folder / "config.json").read_text())
            files = sorted(folder.glob("*.safetensors"))
            if not files:
                raise ModelError(f"{folder} has no safetensors weights (a .bin is not read)")
            weights = load_file(str(files[0]), device=str(device))
            name = (config.get("activation_function") or "torch.nn.Identity").rsplit(".", 1)[-1]
            activation = getattr(torch.nn, name, None)
            if activation is None:
                raise ModelError(f"{folder}: activation {config.get('activation_function')} is not known to torch.nn")
            bias = weights.get("linear.bias")
            self.layers.append((weights["linear.weight"].float(), None if bias is None else bias.float(), activation()))

    @property
    def out_features(self) -> int:
        return int(self.layers[-1][0].shape[0])

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        for weight, bias, activation in self.layers:
            pooled = activation(torch.nn.functional.linear(pooled, weight, bias))
        return pooled
