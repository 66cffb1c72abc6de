"""The start-up fidelity check: the serving path (attention backend, dtype, CUDA graphs through
their eager run, capture and replay) against a float32 eager reference of the same weights on a
fixed set of sequences. A path that diverges by more than 0.1% is not served.

The reference's vectors are kept on disk (rose.cache) under a key of everything they depend on,
so a later start with the same model files, code and device runs only the serving path: the
float32 model's first run took 0.6-0.8 s of each start on the H200."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rose.attention import create_backend
from rose.batch import RaggedBatch
from rose.cache import cache_dir, write_whole
from rose.pooling import pool

if TYPE_CHECKING:
    from rose.engine import Engine

log = logging.getLogger(__name__)

LENGTHS = (1, 3, 8, 16, 17, 32, 64, 100, 128, 200, 256, 300, 400, 512)


def sequences(vocab: int, max_length: int) -> list[list[int]]:
    """The fixed sequences: random ids of lengths that cross several graph buckets."""
    rng = np.random.default_rng(1234)
    return [rng.integers(0, vocab, size=min(n, max_length)).tolist() for n in LENGTHS]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def reference(
    engine: Engine, batch_sequences: list[list[int]], weights: dict[str, torch.Tensor] | None = None
) -> np.ndarray:
    """Pooled vectors of the float32 model with eager SDPA attention on the engine's device;
    `weights`: the checkpoint's tensors if at hand (else read again)."""
    model = engine.reference_model(weights)
    spec = dataclasses.replace(model.attention_spec, dtype=torch.float32)
    attention = create_backend("sdpa", spec, engine.device)
    lengths = np.array([len(s) for s in batch_sequences])
    ids, cu = np.concatenate(batch_sequences), np.concatenate([[0], np.cumsum(lengths)])
    batch = RaggedBatch.from_host(ids, cu, engine.device)
    attention.plan(batch)
    with torch.inference_mode():
        return pool(model.forward(batch, attention), batch, engine.pooling).cpu().numpy()


def stored_reference(
    engine: Engine, batch_sequences: list[list[int]], weights: dict[str, torch.Tensor] | None = None
) -> tuple[np.ndarray, str]:
    """The reference's vectors and where they came from: "stored" when an earlier start with
    the same inputs kept them, else "computed" (and kept for the next start)."""
    path = cache_dir("fidelity", f"{_reference_key(engine, batch_sequences)}.npy")
    try:
        vectors = np.load(path)
        if vectors.shape == (len(batch_sequences), engine.dimensions) and np.isfinite(vectors).all():
            return vectors, "stored"
    except (OSError, ValueError, EOFError):
        pass
    vectors = reference(engine, batch_sequences, weights)
    _store(path, vectors)
    return vectors, "computed"


def _reference_key(engine: Engine, batch_sequences: list[list[int]]) -> str:
    """A digest of what the reference's vectors depend on: the model's files (by name, size and
    modification time, not content, which would take longer to read than to compute), its
    config, the pooling, the sequences, the device's kind, torch's version and ROSE's source."""
    digest = hashlib.sha256()
    root = engine.model_dir.path.resolve()
    digest.update(str(root).encode())
    for file in sorted(root.iterdir()):
        if file.suffix in (".safetensors", ".json"):
            stat = file.stat()
            digest.update(f"{file.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps([engine.pooling, engine.device.type, torch.__version__, batch_sequences]).encode())
    for source in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:32]


def _store(path: Path, vectors: np.ndarray) -> None:
    """Keeps `vectors` at `path` for later starts, where the cache folder can be written."""
    try:
        write_whole(path, lambda out: np.save(out, vectors))
    except OSError as why:  # a read-only home: every start computes the reference
        log.info("the fidelity reference is not kept (%s)", why)


TIERS = ("single", "short", "long")
"""The check's batches by the path that serves them: single queries alone (the model's path for
them, under the engine's smallest bucket), the short ones together (online queries, which the triton
attention backend takes up to 64 tokens) with the longest of them alone, and all of them at once."""


def tier_batches(engine: Engine, fixed: list[list[int]], tier: str) -> list[slice]:
    """The slices of the fixed sequences that make up the batches of `tier` (see TIERS)."""
    short = next((i for i in range(len(fixed)) if sum(map(len, fixed[: i + 1])) > 64), len(fixed))
    if tier == "single":
        return [slice(i, i + 1) for i in range(short) if len(fixed[i]) <= (engine.smallest_bucket or 0)]
    if tier == "short":
        return [slice(0, short), slice(short - 1, short)]
    if tier == "long":
        return [slice(0, len(fixed))]
    raise ValueError(f"unknown tier {tier!r}; use {', '.join(TIERS)}")


def check(
    engine: Engine,
    expected: tuple[list[list[int]], np.ndarray],
    threshold: float = 0.999,
    tiers: tuple[str, ...] = TIERS,
) -> dict[str, Any]:
    """Runs the engine's path on the batches of `tiers` (see TIERS) made of the fixed sequences
    of `expected`, and compares with the reference's vectors there; single queries run so that
    their graphs are captured before the first query comes. On divergence turns graphs off, then
    falls back to the torch attention backend, and says so in the log and in the report it returns."""
    fixed, vectors = expected
    slices = [s for tier in tiers for s in tier_batches(engine, fixed, tier)]
    fallbacks = []
    while True:
        # Three runs: with lazy graphs, a bucket's eager run, its capture and a replay.
        worst = min(
            float(cosines(engine.embed_ids(fixed[s], normalize=False), vectors[s]).min())
            for _ in range(3)
            for s in slices
        )
        path = f"{engine.attention.name}, {engine.dtype_name}, graphs {engine.graphs.mode if engine.graphs else 'off'}"
        if worst >= threshold:
            break
        log.warning("the path %s diverges from float32 (worst cosine %.6f); not serving it", path, worst)
        fallbacks.append({"path": path, "worst_cosine": worst})
        if engine.graphs is not None:
            engine.graphs = None
        elif engine.attention.name != "torch" and engine.device.type == "cuda":
            engine.use_attention("torch")
        else:
            break
    checked = len({i for s in slices for i in range(len(fixed))[s]})
    log.info("fidelity check: worst cosine %.6f against float32 over %d sequences (%s)", worst, checked, path)
    return {
        "worst_cosine": worst,
        "threshold": threshold,
        "path": path,
        "sequences": checked,
        "tiers": list(tiers),
        "fallbacks": fallbacks,
    }
