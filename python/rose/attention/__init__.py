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
# most the bound. Measured by benches/attention.py (benches/RESULTS.md has the table): with
# head_dim 32 (MiniLM), torch's varlen kernel leads up to 512-token sequences and FA4 beyond;
# with head_dim 64 (the BERT-base family: bge-base, bge-reranker-base), FlashInfer FA2 leads up
# to ~250-token sequences (rerank pairs; its plan is also a quarter of FA3's) and FA3 beyond;
# with head_dim 128 (Qwen3), FlashInfer FA2 leads on short queries and FA3 from 32 tokens up.
# Shapes not listed take GPU_ORDER.
AUTO_TABLE: dict[tuple[int, bool], list[tuple[float, str]]] = {
    (32, False): [(1024, "torch"), (math.inf, "fa4")],
    (64, False): [(256, "fa2"), (math.inf, "fa3")],
    (128, False): [(64, "fa2"), (math.inf, "fa3")],
    (128, True): [(64, "fa2"), (math.inf, "fa3")],
}
GPU_ORDER = ["fa3", "fa4", "fa2", "torch"]
# Backends whose libraries take a second or more to import (FlashInfer and FA4 load the CuTe DSL).
HEAVY = {"fa2", "fa3", "fa4"}
# Shapes whose small batches (online queries: SmallBatchBackend's max_tokens or fewer in all) take
# ROSE's Triton kernel instead: Qwen3's and MiniLM's, where benches/latency.py measured it faster
# than the library kernels on short queries.
SMALL_BATCH_SHAPES = {(128, False), (128, True), (32, False)}


def reachable(table: list[tuple[float, str]], max_length: float) -> list[tuple[float, str]]:
    """The entries of a table that batches of sequences of at most `max_length` tokens reach (a
    batch's mean length is at most its longest sequence's)."""
    out = []
    for bound, name in table:
        out.append((bound, name))
        if bound >= max_length:
            break
    return out


class AutoBackend(AttentionBackend):
    """The backends of the measured table for this shape that load here (else the first of
    GPU_ORDER that does); each batch goes to the fastest one for its shape. Backends the table
    does not name, or names only for sequences longer than `max_length`, are not loaded.

    With `defer`, the HEAVY backends are left out: the engine serves its first requests with the
    others (torch's varlen kernel, the Triton kernel) and imports the rest on a background thread
    (`import_deferred`), then builds a full AutoBackend once they are in."""

    name = "auto"
    takes_window = True  # it routes only to the backends that load for the spec

    def __init__(
        self, spec: AttentionSpec, device: torch.device, max_length: float = math.inf, defer: bool = False
    ) -> None:
        super().__init__(spec, device)
        table = reachable(AUTO_TABLE.get((spec.head_dim, spec.causal), []), max_length)
        named = [name for _, name in table]
        candidates = list(dict.fromkeys(named + GPU_ORDER))
        self.backends: dict[str, AttentionBackend] = {}
        self.deferred: list[str] = []
        reasons: list[str] = []
        if defer:
            light = [name for name in candidates if name not in HEAVY]
            self._load(light, [name for name in named if name not in HEAVY], reasons)
            # Deferring needs a backend to serve meanwhile, one that loads without a heavy import.
            if self.backends:
                self.deferred = [name for name in named if name in HEAVY]
        if not self.backends:
            self._load(candidates, named, reasons)
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

    def _load(self, candidates: list[str], named: list[str], reasons: list[str]) -> None:
        """Loads the `named` candidates that load here, else the first other one that does."""
        for name in candidates:
            if self.backends and name not in named:
                break
            try:
                self.backends[name] = BACKENDS[name](self.spec, self.device)
            except BackendUnavailable as why:
                reasons.append(f"{name}: {why}")
                log.info("attention backend %s unavailable: %s", name, why)

    def import_deferred(self) -> None:
        """Imports the deferred backends' libraries (seconds; run it off the engine's thread).
        Those that do not import are dropped from `deferred`."""
        for name in list(self.deferred):
            try:
                BACKENDS[name].import_libraries()
            except BackendUnavailable as why:
                log.info("attention backend %s unavailable: %s", name, why)
                self.deferred.remove(name)

    def takes_small(self, tokens: int) -> bool:
        """True when a batch of `tokens` goes to the Triton kernel for small batches."""
        return self.small is not None and tokens <= self.small.max_tokens

    def choose(self, batch: RaggedBatch) -> AttentionBackend:
        if self.takes_small(batch.num_tokens):
            return self.small
        name = next((name for bound, name in self.table if batch.mean_length <= bound), self.fallback)
        return self.backends[name]

    def plan(self, batch: RaggedBatch) -> None:
        self.current = self.choose(batch)
        self.current.plan(batch)

    def for_graph(self, key: tuple[int, int], batch: RaggedBatch) -> AttentionBackend:
        # A graph keeps the backend chosen for the first batch of its bucket.
        return self.choose(batch).for_graph(key, batch)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windowed: bool = False) -> torch.Tensor:
        return self.current(q, k, v, windowed=True) if windowed else self.current(q, k, v)

    def norm_rope_attention(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                            rope: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        return self.current.norm_rope_attention(qkv, q_norm, k_norm, eps, rope)


def create_backend(
    name: str, spec: AttentionSpec, device: torch.device, max_length: float = math.inf, defer: bool = False
) -> AttentionBackend:
    """The backend `name`; "auto" picks per batch among those that load here (sdpa on the CPU),
    for sequences of at most `max_length` tokens, leaving the heavy ones for later with `defer`."""
    if name == "auto":
        if device.type == "cpu" or spec.relative_bias is not None:
            # The GPU's kernels take no relative bias: such models (MPNet) run SDPA there too.
            return SdpaBackend(spec, device)
        return AutoBackend(spec, device, max_length, defer)
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(BACKENDS)}")
    return BACKENDS[name](spec, device)
