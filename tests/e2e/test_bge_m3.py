"""BGE-M3's three outputs from one pass, /embed_all and Encode over gRPC, against FlagEmbedding's
M3 embedder in float32 on the same random-weight folder (saved as BGE-M3 is published)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from support import Server, save_bge_m3, start_server

TEXTS = ["what is BGE-M3?", "a multi-lingual, multi-granular embedding model with three heads", "dense sparse colbert"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_bge_m3(tmp_path_factory.mktemp("m3") / "bge-m3")


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("m3-logs"), "--model", str(folder))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict:
    # The M3 module imports on its own where the package's top level may not.
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    m3 = M3Embedder(str(folder), use_fp16=False, devices="cpu", normalize_embeddings=True)
    return m3.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, batch_size=8)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_the_three_outputs_of_one_request_match_flagembedding(server: Server, reference: dict) -> None:
    body = {"inputs": TEXTS, "outputs": ["dense", "sparse", "multi_vector"]}
    answer = requests.post(f"{server.url}/encode", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    dense = np.array([d["dense"] for d in data])
    assert cosines(dense, reference["dense_vecs"]).min() >= 0.9999
    for item, weights, colbert in zip(data, reference["lexical_weights"], reference["colbert_vecs"], strict=True):
        got = {str(e["index"]): e["value"] for e in item["sparse"]}
        assert got.keys() == weights.keys() and got
        for token, value in weights.items():
            assert got[token] == pytest.approx(float(value), rel=1e-4, abs=1e-6)
        vectors = np.array(item["multi_vector"])
        assert vectors.shape == colbert.shape
        assert cosines(vectors, colbert).min() >= 0.9999
    assert answer.json()["usage"]["prompt_tokens"] > 0


def test_the_dense_routes_keep_their_vector_and_embed_sparse_gives_the_lexical_weights(
    server: Server, reference: dict
) -> None:
    openai = requests.post(f"{server.url}/v1/embeddings", json={"input": TEXTS}, timeout=60).json()
    dense = np.array([d["embedding"] for d in openai["data"]])
    assert cosines(dense, reference["dense_vecs"]).min() >= 0.9999
    sparse = requests.post(f"{server.url}/embed_sparse", json={"inputs": TEXTS[:1], "top_k": 3}, timeout=60).json()
    best = sorted(reference["lexical_weights"][0].items(), key=lambda kv: -kv[1])[:3]
    assert sorted(e["index"] for e in sparse[0]) == sorted(int(token) for token, _ in best)


def test_embed_all_is_every_tokens_final_hidden_state(server: Server, folder: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    answer = requests.post(f"{server.url}/embed_all", json={"inputs": TEXTS[1]}, timeout=60)
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json()[0])
    import torch

    with torch.no_grad():
        expected = model(**tokenizer(TEXTS[1], return_tensors="pt")).last_hidden_state[0].numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_info_lists_the_outputs_and_grpc_clients_get_index_value_arrays(server: Server, reference: dict) -> None:
    import tulip

    info = requests.get(f"{server.url}/info", timeout=10).json()
    assert info["outputs"] == ["dense", "sparse", "multi_vector", "tokens"]
    client = tulip.Client(server.grpc)
    out = client.encode(TEXTS, ["sparse", "multi_vector"])
    sparse, multi = out["sparse"], out["multi_vector"]
    for i, weights in enumerate(reference["lexical_weights"]):
        span = slice(sparse["offsets"][i], sparse["offsets"][i + 1])
        got = dict(zip(map(str, sparse["indices"][span]), sparse["values"][span], strict=True))
        assert got.keys() == weights.keys()
        rows = multi["data"][multi["offsets"][i] : multi["offsets"][i + 1]]
        assert cosines(rows, reference["colbert_vecs"][i]).min() >= 0.9999


def test_bad_requests_name_the_problem(server: Server) -> None:
    unknown = requests.post(f"{server.url}/encode", json={"inputs": ["a"], "outputs": ["colour"]}, timeout=10)
    assert unknown.status_code in (400, 422)
    assert "unknown output" in unknown.json()["error"]
    # 600 inputs of 400 tokens: 128 floats a token (hidden and ColBERT), past 64 MiB.
    body = {"inputs": ["word " * 400] * 600, "outputs": ["tokens", "multi_vector"]}
    huge = requests.post(f"{server.url}/encode", json=body, timeout=120)
    assert huge.status_code == 413 and "MiB" in huge.json()["error"], huge.text


def test_a_dense_model_has_no_multi_vector_output(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        answer = requests.post(f"{server.url}/encode", json={"inputs": ["a"], "outputs": ["multi_vector"]}, timeout=30)
        assert 400 <= answer.status_code < 500 and "no multi_vector output" in answer.json()["error"], answer.text
    finally:
        server.stop()
