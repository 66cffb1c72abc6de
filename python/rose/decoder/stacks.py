"""The decoder layers' weights stacked by layer, as the fused decoders (rose.decoder.triton,
rose.decoder.cuda) read them: each layer's tensors become views into the stacks, so the eager
path and the kernel share one copy; the kernels take the stacks in LAYER_TENSORS' order."""

from __future__ import annotations

import torch

# Each layer tensor the kernels read: the attribute of rose.models.decoder_stack._Layer, then of its Linear.
LAYER_TENSORS = {
    "input_norm": ("input_norm",),
    "qkv": ("qkv", "weight"),
    "q_norm": ("q_norm",),
    "k_norm": ("k_norm",),
    "o": ("o", "weight"),
    "post_norm": ("post_norm",),
    "gate_up": ("gate_up", "weight"),
    "down": ("down", "weight"),
}


def stack_layers(layers: list) -> dict[str, torch.Tensor]:
    """One tensor [layers, ...] for each of LAYER_TENSORS; the layers' tensors become its views."""
    return {name: _stack_into(layers, path) for name, path in LAYER_TENSORS.items()}


def _stack_into(layers: list, path: tuple[str, ...]) -> torch.Tensor:
    def owner(layer: object) -> object:  # the object that holds the tensor
        for attr in path[:-1]:
            layer = getattr(layer, attr)
        return layer

    stack = torch.stack([getattr(owner(layer), path[-1]) for layer in layers])
    for layer, view in zip(layers, stack, strict=True):
        setattr(owner(layer), path[-1], view)
    return stack
