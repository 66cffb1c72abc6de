"""One packed ragged batch: sequences concatenated, no padding."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def as_int32(values: Any) -> np.ndarray:
    """Token ids or offsets from bytes, a buffer, a list or an array, as int32."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        return np.frombuffer(values, dtype=np.int32)
    return np.asarray(values, dtype=np.int32)


@dataclass
class RaggedBatch:
    """Token ids of several sequences, concatenated; `cu_seqlens[i]:cu_seqlens[i+1]` is sequence i.
    Sequences may be empty (the padding of a CUDA graph's bucket)."""

    input_ids: torch.Tensor  # [tokens] int32, on the device
    cu_seqlens: torch.Tensor  # [sequences + 1] int32, on the device
    cu_seqlens_host: torch.Tensor  # the same on the host (page-locked on a GPU), for host-side planning
    max_seqlen: int  # no sequence is longer
    # [1] int32 on the device: the tokens before the padding, when the batch is padded for a graph
    token_count: torch.Tensor | None = None
    # [tokens] int32 on the device: each token's type (segment) id; None: all 0
    token_type_ids: torch.Tensor | None = None
    # (tokens, sequences) before the padding, on the host, when the batch is padded for a graph
    unpadded: tuple[int, int] | None = None

    @classmethod
    def from_host(
        cls, input_ids: Any, cu_seqlens: Any, device: torch.device, token_type_ids: Any = None
    ) -> RaggedBatch:
        """A batch from host arrays, copied to `device` (the simple path: CPU, tests)."""
        ids = torch.from_numpy(as_int32(input_ids).copy())
        cu = torch.from_numpy(as_int32(cu_seqlens).copy())
        longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
        types = None if token_type_ids is None else torch.from_numpy(as_int32(token_type_ids).copy()).to(device)
        return cls(ids.to(device), cu.to(device), cu, longest, token_type_ids=types)

    # Positions and sequence ids are derived on the device, on first use inside the forward pass,
    # so that only ids and offsets travel and a CUDA graph captures the derivation.
    @functools.cached_property
    def seq_ids(self) -> torch.Tensor:
        """[tokens] int64: each token's sequence."""
        index = torch.arange(self.num_tokens, device=self.input_ids.device, dtype=torch.int32)
        return torch.searchsorted(self.cu_seqlens[1:], index, right=True)

    @functools.cached_property
    def positions(self) -> torch.Tensor:
        """[tokens] int32: each token's position in its sequence."""
        index = torch.arange(self.num_tokens, device=self.input_ids.device, dtype=torch.int32)
        return index - self.cu_seqlens[self.seq_ids]

    def device_token_count(self) -> torch.Tensor:
        """[1] int32 on the device: token_count, or (unpadded) all the tokens, as the one-launch
        decoders read it."""
        if self.token_count is not None:
            return self.token_count
        return torch.full((1,), self.num_tokens, dtype=torch.int32, device=self.input_ids.device)

    @property
    def mean_length(self) -> float:
        """The real sequences' mean length: a graph bucket's padding sequence and empty slots
        left out, which would otherwise pull it down."""
        tokens, sequences = self.unpadded or (self.num_tokens, self.num_sequences)
        return tokens / max(sequences, 1)

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def lengths(self) -> list[int]:
        return (self.cu_seqlens_host[1:] - self.cu_seqlens_host[:-1]).tolist()
