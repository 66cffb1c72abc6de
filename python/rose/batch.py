"""One packed ragged batch: sequences concatenated, no padding."""

from __future__ import annotations

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
    """Token ids of several sequences, concatenated; `cu_seqlens[i]:cu_seqlens[i+1]` is sequence i."""

    input_ids: torch.Tensor  # [tokens] int32, on the device
    positions: torch.Tensor  # [tokens] int32, position of each token in its sequence
    seq_ids: torch.Tensor  # [tokens] int64, which sequence each token belongs to
    cu_seqlens: torch.Tensor  # [sequences + 1] int32, on the device
    lengths: list[int]  # on the host, for planning
    cu_seqlens_host: torch.Tensor  # [sequences + 1] int32, on the host

    @classmethod
    def from_host(cls, input_ids: Any, cu_seqlens: Any, device: torch.device) -> RaggedBatch:
        ids = torch.from_numpy(as_int32(input_ids).copy())
        cu = torch.from_numpy(as_int32(cu_seqlens).copy())
        lengths = (cu[1:] - cu[:-1]).tolist()
        seq_ids = torch.repeat_interleave(torch.arange(len(lengths)), cu[1:] - cu[:-1])
        positions = torch.arange(ids.numel(), dtype=torch.int32) - cu[:-1][seq_ids]
        return cls(
            input_ids=ids.to(device, non_blocking=True),
            positions=positions.to(device, non_blocking=True),
            seq_ids=seq_ids.to(device, non_blocking=True),
            cu_seqlens=cu.to(device, non_blocking=True),
            lengths=lengths,
            cu_seqlens_host=cu,
        )

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths, default=0)
