"""The output kinds on the GPU in bfloat16 against the same engine in float32 on the CPU (which the
CPU tests hold to the references: SparseEncoder, FlagEmbedding, PyLate): SPLADE vectors, BGE-M3's
dense, lexical and ColBERT outputs, a ColBERT model's multi-vectors with query expansion. The
bounds are the embedding bound for bfloat16 (cosine >= 0.999, each multi-vector alone) and, for
sparse values, 2e-2 of the vector's largest value (bfloat16 keeps 8 bits of mantissa)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from support import cosines, save_bge_m3, save_colbert, save_splade

TEXTS = ["a", "a short query", " ".join(f"word{i}" for i in range(150)), "The quick brown fox. " * 20]


def tokenized(engine: rose.Engine, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    tokenizer = engine.model_dir.tokenizer()
    tokenizer.no_padding()
    tokenizer.enable_truncation(engine.max_input_length)
    sequences = [e.ids for e in tokenizer.encode_batch(texts)]
    return packed(sequences)


def packed(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in sequences])
    return np.concatenate(sequences).astype(np.int32), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def both(folder: Path) -> tuple[rose.Engine, rose.Engine]:
    return rose.Engine(folder, device="cuda"), rose.Engine(folder, device="cpu", dtype="float32")


def close_sparse(got: np.ndarray, expected: np.ndarray) -> None:
    assert cosines(got, expected).min() >= 0.999
    scale = np.abs(expected).max(axis=-1, keepdims=True)
    assert (np.abs(got - expected) <= 2e-2 * scale).all()


def test_splade_in_bf16(tmp_path: Path) -> None:
    gpu, cpu = both(save_splade(tmp_path / "splade"))
    ids, cu = tokenized(cpu, TEXTS)
    for _ in range(3):  # eager, capture, replay
        close_sparse(gpu.step(ids, cu).wait(), cpu.step(ids, cu).wait())


def test_bge_m3_outputs_in_bf16(tmp_path: Path) -> None:
    gpu, cpu = both(save_bge_m3(tmp_path / "m3"))
    ids, cu = tokenized(cpu, TEXTS)
    hidden, multi = gpu.token_row_layout["hidden_size"], gpu.token_row_layout["multi_vector_dimensions"]
    expected = cpu.step(ids, cu, per_token=True).wait()
    for _ in range(3):
        got = gpu.step(ids, cu, per_token=True).wait()
        assert cosines(got[cu[:-1], :hidden], expected[cu[:-1], :hidden]).min() >= 0.999  # dense: CLS
        colbert = slice(hidden, hidden + multi)
        assert cosines(got[:, colbert], expected[:, colbert]).min() >= 0.999
        close_sparse(got[:, -1][None], expected[:, -1][None])


@pytest.mark.parametrize("attend", [False, True])
def test_colbert_multi_vectors_in_bf16(tmp_path: Path, attend: bool) -> None:
    gpu, cpu = both(save_colbert(tmp_path / "colbert", attend_to_expansion_tokens=attend))
    template = cpu.colbert_template
    ids, cu = tokenized(cpu, TEXTS[:2])
    queries = [[s[0], template["query_prefix_id"], *s[1:]] for s in np.split(ids, cu[1:-1])]
    queries = [q + [template["expansion_id"]] * (template["query_length"] - len(q)) for q in queries]
    ids, cu = packed(queries)
    hidden = cpu.token_row_layout["hidden_size"]
    expected = cpu.step(ids, cu, per_token=True).wait()[:, hidden:]
    for _ in range(3):
        assert cosines(gpu.step(ids, cu, per_token=True).wait()[:, hidden:], expected).min() >= 0.999
