"""The start-up fidelity check: the serving path (attention backend, dtype, CUDA graphs through
their eager run, capture and replay) against a float32 eager reference of the same weights on a
fixed set of sequences. It measures and returns a verdict; the engine decides what to do with a
path that fails (rose.serving.startup falls back and checks again).

The reference's vectors are kept on disk (rose.runtime.cache) under a key of everything they
depend on, so a later start with the same model files, code and device runs only the serving
path: the float32 model's first run is the check's largest cost on a start."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose.attention import create_backend
from rose.batch import RaggedBatch
from rose.models.pooling import pool
from rose.runtime.cache import cache_dir, write_whole

log = logging.getLogger(__name__)

LENGTHS = (1, 3, 8, 16, 17, 32, 64, 100, 128, 200, 256, 300, 400, 512)

TIERS = ("single", "short", "long")
"""The check's batches by the path that serves them: single queries alone (the fused decoder's,
under the engine's smallest bucket), the short ones together (online queries, which the triton
attention backend takes up to 64 tokens) with the longest of them alone, and all of them at once."""

THRESHOLD = 0.999
"""The worst cosine against the reference that a path may have and be served (divergence within 0.1%)."""

SCORE_BOUND = 1e-2
"""A score model's largest difference from the reference's scores (probabilities, as served) that
a path may have and be served: its pooled states can pass the cosine bound while its head turns
their error into a different ranking."""

SHORT_TOKENS = 64
"""The "short" tier's batch: the first sequences that fit in this many tokens together."""

Run = Callable[[list[list[int]]], np.ndarray]
"""The serving path: token-id sequences (one batch) to pooled float32 vectors."""

Scores = Callable[[np.ndarray], np.ndarray]
"""A score model's head: pooled float32 states to its scores (probabilities), as served."""


def sequences(vocab: int, max_length: int) -> list[list[int]]:
    """The fixed sequences: random ids of lengths that cross several graph buckets."""
    rng = np.random.default_rng(1234)
    return [rng.integers(0, vocab, size=min(n, max_length)).tolist() for n in LENGTHS]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` with the same row of `b`."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def tier_batches(lengths: list[int], tier: str, smallest_bucket: int | None) -> list[slice]:
    """The slices of the fixed sequences (of these `lengths`) that make up the batches of `tier`."""
    short = next((i for i in range(len(lengths)) if sum(lengths[: i + 1]) > SHORT_TOKENS), len(lengths))
    if tier == "single":
        return [slice(i, i + 1) for i in range(short) if lengths[i] <= (smallest_bucket or 0)]
    if tier == "short":
        return [slice(0, short), slice(short - 1, short)]
    if tier == "long":
        return [slice(0, len(lengths))]
    raise ValueError(f"unknown tier {tier!r}; use {', '.join(TIERS)}")


@dataclass
class Verdict:
    """What one check of one path found."""

    path: str
    worst_cosine: float
    threshold: float
    sequences: int
    tiers: list[str]
    fallbacks: list[dict] = field(default_factory=list)
    reference: str = "computed"
    worst_score_error: float | None = None
    """A score model's largest score difference from the reference (None for embedders)."""

    @property
    def states_hold(self) -> bool:
        """The pooled states are within the cosine bound (a 16-bit path's scores may still miss
        theirs through rounding that no plainer 16-bit path changes)."""
        return self.worst_cosine >= self.threshold

    @property
    def passed(self) -> bool:
        return self.states_hold and (self.worst_score_error is None or self.worst_score_error <= SCORE_BOUND)

    def describe(self) -> str:
        """The worst figures, for the log."""
        scores = "" if self.worst_score_error is None else f", worst score error {self.worst_score_error:.4f}"
        return f"worst cosine {self.worst_cosine:.6f}{scores}"

    def report(self) -> dict:
        """For /info."""
        scores = {} if self.worst_score_error is None else {"worst_score_error": self.worst_score_error,
                                                           "score_bound": SCORE_BOUND}  # fmt: skip
        return {
            "worst_cosine": self.worst_cosine,
            "threshold": self.threshold,
            **scores,
            "path": self.path,
            "sequences": self.sequences,
            "tiers": self.tiers,
            "fallbacks": self.fallbacks,
            "reference": self.reference,
        }


def measure(
    run: Run,
    path: str,
    fixed: list[list[int]],
    expected: np.ndarray,
    tiers: tuple[str, ...],
    smallest_bucket: int | None,
    threshold: float = THRESHOLD,
    scores: Scores | None = None,
) -> Verdict:
    """Runs `run` on the batches of `tiers` made of the `fixed` sequences, three times each (with
    lazy graphs: a bucket's eager run, its capture, a replay, so that single queries' graphs are
    captured before the first query comes), against the reference's `expected` vectors; with a
    score model's head (`scores`), its scores against the reference's too."""
    lengths = [len(s) for s in fixed]
    slices = [s for tier in tiers for s in tier_batches(lengths, tier, smallest_bucket)]
    served = [(run(fixed[s]), expected[s]) for _ in range(3) for s in slices]
    worst = min(float(cosines(got, want).min()) for got, want in served)
    checked = len({i for s in slices for i in range(len(fixed))[s]})
    verdict = Verdict(path, worst, threshold, checked, list(tiers))
    if scores is not None:
        verdict.worst_score_error = max(float(np.abs(scores(got) - scores(want)).max()) for got, want in served)
    return verdict


def reference(model: Any, pooling: str, device: torch.device, fixed: list[list[int]]) -> np.ndarray:
    """Pooled vectors of the `fixed` sequences from `model` (the float32 one, on `device`) with
    eager SDPA attention, in one batch."""
    attention = create_backend("sdpa", dataclasses.replace(model.attention_spec, dtype=torch.float32), device)
    lengths = np.array([len(s) for s in fixed])
    batch = RaggedBatch.from_host(np.concatenate(fixed), np.concatenate([[0], np.cumsum(lengths)]), device)
    attention.plan(batch)
    with torch.inference_mode():
        return pool(model.forward(batch, attention), batch, pooling, getattr(model, "splade", None)).cpu().numpy()


def stored_reference(key: str, compute: Callable[[], np.ndarray], shape: tuple[int, int]) -> tuple[np.ndarray, str]:
    """The reference's vectors and where they came from: "stored" when an earlier start with the
    same `key` kept them, else "computed" (and kept for the next start)."""
    path = cache_dir("fidelity", f"{key}.npy")
    try:
        vectors = np.load(path)
        if vectors.shape == shape and np.isfinite(vectors).all():
            return vectors, "stored"
    except (OSError, ValueError, EOFError):
        pass
    vectors = compute()
    try:
        write_whole(path, lambda out: np.save(out, vectors))
    except OSError as why:  # a read-only home: every start computes the reference
        log.info("the fidelity reference is not kept (%s)", why)
    return vectors, "computed"


def reference_key(model_root: Path, pooling: str, device_type: str, fixed: list[list[int]]) -> str:
    """A digest of what the reference's vectors depend on: the model's files (by name, size and
    modification time, not content, which would take longer to read than to compute), the
    pooling, the sequences, the device's kind, torch's version and ROSE's source."""
    digest = hashlib.sha256()
    root = model_root.resolve()
    digest.update(str(root).encode())
    for file in sorted(root.iterdir()):
        if file.suffix in (".safetensors", ".json"):
            stat = file.stat()
            digest.update(f"{file.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps([pooling, device_type, torch.__version__, fixed]).encode())
    for source in sorted(Path(__file__).parents[1].rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:32]
