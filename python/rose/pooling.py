"""Pooling token states into one vector per sequence, and shaping those vectors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch


def pool(hidden: torch.Tensor, batch: RaggedBatch, mode: str) -> torch.Tensor:
    """[tokens, hidden] -> [sequences, hidden] in float32, by `mode` (mean, cls or last)."""
    hidden = hidden.float()
    # Empty sequences (a CUDA graph bucket's padding) must not index out of range or divide by 0.
    last_token = hidden.shape[0] - 1
    if mode == "cls":
        return hidden[batch.cu_seqlens[:-1].long().clamp(max=last_token)]
    if mode == "last":
        return hidden[(batch.cu_seqlens[1:].long() - 1).clamp(min=0)]
    if mode == "mean":
        sums = torch.zeros(batch.num_sequences, hidden.shape[1], device=hidden.device, dtype=hidden.dtype)
        sums.index_add_(0, batch.seq_ids, hidden)
        counts = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).clamp(min=1).to(hidden.dtype)
        return sums / counts[:, None]
    raise ValueError(f"unknown pooling {mode!r}; use mean, cls or last")


def shape_vectors(pooled: torch.Tensor, dimensions: int | None = None, normalize: bool = True) -> torch.Tensor:
    """Matryoshka truncation to `dimensions`, then L2 normalization."""
    if dimensions is not None:
        if not 1 <= dimensions <= pooled.shape[-1]:
            raise ValueError(f"dimensions must be between 1 and {pooled.shape[-1]}; got {dimensions}")
        pooled = pooled[..., :dimensions]
    return F.normalize(pooled, dim=-1) if normalize else pooled


def quantize_int8(pooled: torch.Tensor) -> torch.Tensor:
    """pplx-embed's int8 output: round(tanh(x) * 127)."""
    return torch.round(torch.tanh(pooled.float()) * 127).to(torch.int8)


def quantize_binary(pooled: torch.Tensor) -> torch.Tensor:
    """One bit per value (x > 0), packed most significant bit first into uint8."""
    bits = (pooled > 0).to(torch.uint8)
    pad = (-bits.shape[-1]) % 8
    bits = F.pad(bits, (0, pad)).view(*bits.shape[:-1], -1, 8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=bits.device)
    return (bits * weights).sum(-1).to(torch.uint8)
