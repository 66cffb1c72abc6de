"""A ColBERT model as PyLate publishes it: its queries' and documents' multi-vectors over /encode
and gRPC, and MaxSim through the rerank routes, against PyLate's own ColBERT in float32 on the
same random-weight folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from support import Server, pylate_reference, save_colbert, start_server

QUERIES = ["what is late interaction?", "colbert, maxsim: how do they score?"]
DOCUMENTS = [
    "ColBERT encodes every token of a document into its own small vector.",
    "Late interaction: each query token finds its best match among the document's tokens, and the matches add up!",
    "Paris is the capital of France.",
    # Past the documents' length (48 tokens), cut as PyLate cuts it.
    "A long passage, with commas, semicolons; and full stops. " * 12,
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_colbert(tmp_path_factory.mktemp("colbert") / "colbert")


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("colbert-logs"), "--model", str(folder), "--auto-truncate")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict:
    return pylate_reference(folder, QUERIES, DOCUMENTS)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def encode(server: Server, inputs: list[str], input_type: str, **extra: object) -> list:
    body = {"inputs": inputs, "outputs": ["multi_vector"], "input_type": input_type, **extra}
    answer = requests.post(f"{server.url}/encode", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return [item["multi_vector"] for item in answer.json()["data"]]


def test_queries_and_documents_match_pylate_vector_by_vector(server: Server, reference: dict) -> None:
    for kind, texts, expected in (("query", QUERIES, reference["queries"]),
                                  ("document", DOCUMENTS, reference["documents"])):  # fmt: skip
        for got, want in zip(encode(server, texts, kind), expected, strict=True):
            got = np.array(got)
            # Queries: 32 vectors each (expansion); documents: their skiplist's tokens left out.
            assert got.shape == want.shape, kind
            assert cosines(got, want).min() >= 0.9999, kind


def test_rerank_routes_score_by_maxsim_as_pylate(server: Server, reference: dict) -> None:
    for query, expected in zip(QUERIES, reference["scores"], strict=True):
        body = {"query": query, "texts": DOCUMENTS, "truncate": True}
        answer = requests.post(f"{server.url}/rerank", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        got = {r["index"]: r["score"] for r in answer.json()}
        np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected, rtol=1e-4)
        assert [r["index"] for r in answer.json()] == list(np.argsort(-expected, kind="stable"))
    cohere = requests.post(f"{server.url}/v2/rerank", json={"query": QUERIES[0], "documents": DOCUMENTS, "top_n": 2},
                           timeout=60)  # fmt: skip
    assert cohere.status_code == 200, cohere.text
    assert [r["index"] for r in cohere.json()["results"]] == list(np.argsort(-reference["scores"][0]))[:2]


def test_grpc_clients_get_the_same_vectors_and_quantized_ones(server: Server, reference: dict) -> None:
    import tulip

    client = tulip.Client(server.grpc)
    assert client.info()["outputs"] == ["multi_vector", "tokens"]
    out = client.encode(DOCUMENTS, ["multi_vector"], input_type="document")["multi_vector"]
    for i, want in enumerate(reference["documents"]):
        rows = out["data"][out["offsets"][i] : out["offsets"][i + 1]]
        assert cosines(rows, want).min() >= 0.9999
    floats = out["data"]
    int8 = client.encode(DOCUMENTS, ["multi_vector"], encoding="int8")["multi_vector"]["data"]
    np.testing.assert_array_equal(int8, np.round(np.tanh(floats) * 127).astype(np.int8))
    bits = client.encode(DOCUMENTS, ["multi_vector"], encoding="binary")["multi_vector"]["data"]
    np.testing.assert_array_equal(bits, np.packbits(floats > 0, axis=1))
    http = encode(server, DOCUMENTS[:1], "document", encoding_format="int8")[0]
    np.testing.assert_array_equal(http, int8[: len(http)])


def test_bad_requests_name_the_problem(server: Server) -> None:
    dense = requests.post(f"{server.url}/v1/embeddings", json={"input": ["a"]}, timeout=10)
    assert dense.status_code == 400 and "/encode" in dense.json()["error"], dense.text
    kind = requests.post(f"{server.url}/encode", json={"inputs": ["a"], "outputs": ["multi_vector"],
                                                       "input_type": "passage"}, timeout=10)  # fmt: skip
    assert kind.status_code == 422 and "input_type" in kind.json()["error"], kind.text
    encoding = requests.post(f"{server.url}/encode", json={"inputs": ["a"], "outputs": ["multi_vector"],
                                                           "encoding_format": "int4"}, timeout=10)  # fmt: skip
    assert encoding.status_code == 422 and "encoding_format" in encoding.json()["error"], encoding.text
    sparse = requests.post(f"{server.url}/embed_sparse", json={"inputs": ["a"]}, timeout=10)
    assert 400 <= sparse.status_code < 500


def test_a_model_that_attends_to_its_expansion_tokens(tmp_path: Path) -> None:
    folder = save_colbert(tmp_path / "attending", attend_to_expansion_tokens=True)
    expected = pylate_reference(folder, QUERIES, DOCUMENTS[:1])["queries"]
    server = start_server(tmp_path, "--model", str(folder))
    try:
        for got, want in zip(encode(server, QUERIES, "query"), expected, strict=True):
            assert cosines(np.array(got), want).min() >= 0.9999
    finally:
        server.stop()
