"""The interface every attention backend implements over a packed ragged batch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from rose.batch import RaggedBatch


@dataclass(frozen=True)
class AttentionSpec:
    """The attention a model needs, independent of how it is computed."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (missing library, device, or unsupported shape); says why."""


class AttentionBackend(ABC):
    """Attention over ragged sequences, with no padding and no KV cache."""

    name: str

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device

    @abstractmethod
    def plan(self, batch: RaggedBatch) -> None:
        """Host-side preparation for one batch, shared by every layer."""

    @abstractmethod
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] -> [tokens, heads, dim]."""
