"""Attention backends over ragged batches, chosen by name or automatically."""

from __future__ import annotations

import logging
import math

import torch

from rose.attention.base import AttentionBackend, AttentionSpec, BackendUnavailable
from rose.attention.fa4 import FlashAttention4Backend
from rose.attention.flashinfer import FlashInfer3Backend, FlashInferBackend
from rose.attention.sdpa import SdpaBackend
from rose.attention.torch_varlen import TorchVarlenBackend
from rose.attention.triton_small import SmallBatchBackend
from rose.batch import RaggedBatch

__all__ = ["AttentionBackend", "AttentionSpec", "BackendUnavailable", "create_backend", "BACKENDS"]

log = logging.getLogger(__name__)

BACKENDS: dict[str, type[AttentionBackend]] = {
    "sdpa": SdpaBackend,
    "fa2": FlashInferBackend,
    "fa3": FlashInfer3Backend,
    "fa4": FlashAttention4Backend,
    "torch": TorchVarlenBackend,
}

# The fastest GPU backend by (head_dim, causal), for batches whose mean sequence length is at
# most the bound. From benches/attention.py on the H200, 2026-11-29 (benches/RESULTS.md): with
# head_dim 32 (MiniLM), torch's varlen kernel leads up to 512-token sequences and FA4 beyond;
# with head_dim 128 (Qwen3), FlashInfer FA2 leads on short queries and FA3 from 32 tokens up.
# Shapes not listed take GPU_ORDER.
AUTO_TABLE: dict[tuple[int, bool], list[tuple[float, str]]] = {
    (32, False): [(1024, "torch"), (math.inf, "fa4")],
    (128, False): [(64, "fa2"), (math.inf, "fa3")],
    (128, True): [(64, "fa2"), (math.inf, "fa3")],
}
GPU_ORDER = ["fa3", "fa4", "fa2", "torch"]
# Shapes whose small batches (online queries: SmallBatchBackend's max_tokens or fewer in all) take
# ROSE's Triton kernel instead (benches/latency.py on the H200, benches/RESULTS.md).
SMALL_BATCH_SHAPES = {(128, False), (128, True)}


class AutoBackend(AttentionBackend):
    """The backends of the measured table for this shape that load here (else the first of
    GPU_ORDER that does); each batch goes to the fastest one for its shape. Backends the table
    does not name are not loaded: importing one (FA4's CuTe DSL) costs start-up time."""

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        table = AUTO_TABLE.get((spec.head_dim, spec.causal), [])
        named = [name for _, name in table]
        self.backends: dict[str, AttentionBackend] = {}
        reasons = []
        for name in dict.fromkeys(named + GPU_ORDER):
            if self.backends and name not in named:
                break
            try:
                self.backends[name] = BACKENDS[name](spec, device)
            except BackendUnavailable as why:
                reasons.append(f"{name}: {why}")
                log.info("attention backend %s unavailable: %s", name, why)
        if not self.backends:
            raise BackendUnavailable("no attention backend can run here: " + "; ".join(reasons))
        self.table = [(bound, name) for bound, name in table if name in self.backends]
        self.fallback = next(iter(self.backends))
        self.current = self.backends[self.fallback]
        self.small: SmallBatchBackend | None = None
        if (spec.head_dim, spec.causal) in SMALL_BATCH_SHAPES:
            try:
                self.small = SmallBatchBackend(spec, device)
            except BackendUnavailable as why:
                log.info("attention backend triton unavailable: %s", why)
        self.name = "auto(" + ",".join([*self.backends, *(["triton"] if self.small else [])]) + ")"

    def choose(self, batch: RaggedBatch) -> AttentionBackend:
        if self.small is not None and batch.num_tokens <= self.small.max_tokens:
            return self.small
        mean_length = batch.num_tokens / max(batch.num_sequences, 1)
        name = next((name for bound, name in self.table if mean_length <= bound), self.fallback)
        return self.backends[name]

    def plan(self, batch: RaggedBatch) -> None:
        self.current = self.choose(batch)
        self.current.plan(batch)

    def for_graph(self, key: tuple[int, int], batch: RaggedBatch) -> AttentionBackend:
        # A graph keeps the backend chosen for the first batch of its bucket.
        return self.choose(batch).for_graph(key, batch)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.current(q, k, v)

    def norm_rope_attention(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                            rope: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        return self.current.norm_rope_attention(qkv, q_norm, k_norm, eps, rope)


def create_backend(name: str, spec: AttentionSpec, device: torch.device) -> AttentionBackend:
    """The backend `name`; "auto" picks per batch among those that load here (sdpa on the CPU)."""
    if name == "auto":
        return SdpaBackend(spec, device) if device.type == "cpu" else AutoBackend(spec, device)
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(BACKENDS)}")
    return BACKENDS[name](spec, device)
