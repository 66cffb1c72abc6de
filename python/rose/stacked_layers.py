"""The decoder layers' weights stacked by layer, as the one-launch decoders (rose.fused_decoder,
rose.cuda_decoder) read them: each layer's tensors become views into the stacks, so the eager
path and the kernel share one copy. Also the tensors the Triton kernel takes, in their order (the
CUDA one takes the stacks in LAYER_TENSORS' order too)."""

from __future__ import annotations

import torch

from rose.batch import RaggedBatch

# Each layer tensor the kernels read: the attribute of rose.models.qwen3._Layer, then of its Linear.
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


def kernel_tensors(
    x: torch.Tensor, batch: RaggedBatch, rope: torch.Tensor, barrier: torch.Tensor, stacks: dict[str, torch.Tensor],
    qkv_width: int, inter: int,
) -> list[torch.Tensor]:  # fmt: skip
    """rose.fused_decoder's tensor arguments: x, their scratch q/k/v [tokens, qkv_width] and activation
    [tokens, inter], the token count (the batch's, or x's rows), positions, sequence ids, rope,
    the grid barrier, then the stacks in LAYER_TENSORS' order."""
    tokens, dtype, device = x.shape[0], stacks["qkv"].dtype, x.device
    count = batch.token_count
    if count is None:
        count = torch.full((1,), tokens, dtype=torch.int32, device=device)
    qkv = torch.empty(tokens, qkv_width, dtype=dtype, device=device)
    act = torch.empty(tokens, inter, dtype=dtype, device=device)
    return [x, qkv, act, count, batch.positions, batch.seq_ids, rope, barrier, *(stacks[n] for n in LAYER_TENSORS)]
