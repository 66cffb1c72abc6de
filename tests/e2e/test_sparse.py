"""SPLADE over TEI's /embed_sparse: a random BertForMaskedLM published as sentence-transformers'
SparseEncoder saves it, against SparseEncoder.encode in float32 (the same non-zero indices,
values within 1e-4 relative), pruning, and the 4xx of a route asked of the wrong kind of model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from support import Server, save_splade, start_server, varied_texts


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    folder = save_splade(tmp_path_factory.mktemp("splade") / "splade")
    server = start_server(folder.parent, "--model", str(folder))
    yield server, folder
    server.stop()


def as_dense(entries: list[dict], width: int) -> np.ndarray:
    row = np.zeros(width, dtype=np.float32)
    indices = [e["index"] for e in entries]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    row[indices] = [e["value"] for e in entries]
    return row


def test_the_sparse_vectors_match_sparse_encoder(splade: tuple[Server, Path]) -> None:
    from sentence_transformers import SparseEncoder

    server, folder = splade
    texts = varied_texts(24)
    answer = requests.post(f"{server.url}/embed_sparse", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    reference = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    assert requests.get(f"{server.url}/info", timeout=10).json()["pooling"] == "splade"
    for text, entries, expected in zip(texts, answer.json(), reference, strict=True):
        got = as_dense(entries, expected.shape[0])
        assert np.array_equal(got > 0, expected > 0), text
        nonzero = expected > 0
        assert np.abs(got[nonzero] - expected[nonzero]).max() <= 1e-4 * np.abs(expected[nonzero]).max(), text
        assert 0 < nonzero.sum() < expected.shape[0] // 10  # sparse, as the bias makes it


def test_top_k_and_min_value_prune_each_vector(splade: tuple[Server, Path]) -> None:
    server, _ = splade
    texts = ["a query about sparse retrieval", "lexical weights for hybrid search"]
    full = requests.post(f"{server.url}/embed_sparse", json={"inputs": texts}, timeout=60).json()
    top = requests.post(f"{server.url}/embed_sparse", json={"inputs": texts, "top_k": 5}, timeout=60).json()
    for everything, five in zip(full, top, strict=True):
        largest = sorted(everything, key=lambda e: (-e["value"], e["index"]))[:5]
        assert five == sorted(largest, key=lambda e: e["index"])
    # Halfway between two values: a batch of one rounds its values unlike a batch of two (1e-7).
    values = sorted(e["value"] for e in full[0])
    floor = (values[len(values) // 2] + values[len(values) // 2 + 1]) / 2
    above = requests.post(f"{server.url}/embed_sparse", json={"inputs": texts[0], "min_value": floor}, timeout=60)
    kept = [e for e in full[0] if e["value"] >= floor]
    assert [e["index"] for e in above.json()[0]] == [e["index"] for e in kept]
    np.testing.assert_allclose([e["value"] for e in above.json()[0]], [e["value"] for e in kept], rtol=1e-5)
    for bad in ({"top_k": 0}, {"min_value": -1}):
        refused = requests.post(f"{server.url}/embed_sparse", json={"inputs": "x", **bad}, timeout=60)
        assert refused.status_code == 422 and next(iter(bad)) in refused.json()["error"], refused.text


def test_dense_routes_refuse_a_splade_model_and_embed_sparse_a_dense_one(
    splade: tuple[Server, Path], tmp_path: Path
) -> None:
    server, _ = splade
    dense = requests.post(f"{server.url}/v1/embeddings", json={"input": "x"}, timeout=60)
    assert dense.status_code == 400 and "/embed_sparse" in dense.json()["error"], dense.text
    minilm = start_server(tmp_path)
    try:
        sparse = requests.post(f"{minilm.url}/embed_sparse", json={"inputs": "x"}, timeout=60)
        assert sparse.status_code == 400 and "no sparse output" in sparse.json()["error"], sparse.text
        assert requests.post(f"{minilm.url}/embed", json={"inputs": "x"}, timeout=60).status_code == 200
    finally:
        minilm.stop()
