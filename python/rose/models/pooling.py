"""Pooling token states into one vector per sequence. Shaping the vectors (truncation,
normalization, quantization) is Tulip's, per request (crates/tulip/src/postprocess.rs)."""

from __future__ import annotations

from typing import Any

import torch

from rose.attention import AttentionBackend
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.loading.model_dir import POOLING_MODES
from rose.models.sparse import SpladeHead


def selected_rows(batch: RaggedBatch, mode: str) -> torch.Tensor | None:
    """The one token row a sequence that `mode` reads (cls: its first, last: its last), or None
    where it reads them all."""
    # Empty sequences (a CUDA graph bucket's padding) must not index out of range.
    if mode == "cls":
        return batch.cu_seqlens[:-1].long().clamp(max=batch.num_tokens - 1)
    if mode == "last":
        return (batch.cu_seqlens[1:].long() - 1).clamp(min=0)
    return None


def pooled_forward(model: Any, batch: RaggedBatch, attention: AttentionBackend, mode: str) -> torch.Tensor:
    """`model`'s pooled float32 states by `mode`; where the mode reads one row a sequence, the
    model's last layer runs past attention on those rows alone."""
    rows = selected_rows(batch, mode)
    if rows is None:
        return pool(model.forward(batch, attention), batch, mode, getattr(model, "splade", None))
    return model.forward(batch, attention, rows).float()


def pool(hidden: torch.Tensor, batch: RaggedBatch, mode: str, splade: SpladeHead | None = None) -> torch.Tensor:
    """[tokens, hidden] -> [sequences, hidden] in float32, by `mode` (POOLING_MODES: mean, cls,
    last, max, or weightedmean, sentence-transformers' weights of 1, 2, 3, ... by position), or
    [sequences, vocabulary] through a SPLADE model's head (`splade`)."""
    if mode == "splade":
        if splade is None:
            raise ModelError("SPLADE pooling needs the model's masked-LM head")
        return splade(hidden, batch)
    hidden = hidden.float()
    rows = selected_rows(batch, mode)
    if rows is not None:
        return hidden[rows]
    if mode == "mean":
        sums = torch.zeros(batch.num_sequences, hidden.shape[1], device=hidden.device, dtype=hidden.dtype)
        sums.index_add_(0, batch.seq_ids, hidden)
        # Empty sequences (a CUDA graph bucket's padding) must not divide by 0.
        counts = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).clamp(min=1).to(hidden.dtype)
        return sums / counts[:, None]
    if mode == "max":
        out = torch.zeros(batch.num_sequences, hidden.shape[1], device=hidden.device, dtype=hidden.dtype)
        index = batch.seq_ids[:, None].expand_as(hidden)
        return out.scatter_reduce_(0, index, hidden, "amax", include_self=False)
    if mode == "weightedmean":
        weights = (batch.positions + 1).to(hidden.dtype)
        sums = torch.zeros(batch.num_sequences, hidden.shape[1], device=hidden.device, dtype=hidden.dtype)
        sums.index_add_(0, batch.seq_ids, hidden * weights[:, None])
        totals = torch.zeros(batch.num_sequences, device=hidden.device, dtype=hidden.dtype)
        totals.index_add_(0, batch.seq_ids, weights)
        return sums / totals.clamp(min=1)[:, None]
    raise ModelError(f"unknown pooling {mode!r}; use {', '.join(POOLING_MODES)}")
