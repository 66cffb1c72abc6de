"""Scoring over HTTP and gRPC with real clients (requests, the Cohere SDK, tulip.Client): a BERT
cross-encoder against sentence-transformers' CrossEncoder.predict, an XLM-RoBERTa reranker and a
Qwen3-Reranker against transformers in float32 (|score - reference| <= 1e-4, the order of 100
candidates the same up to closer ties), an embedding model reranking by cosine, and bad input."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from support import (
    Server,
    classifier_logits,
    pair_ids,
    plain_tokenizer,
    qwen3_reranker_scores,
    save_cross_encoder,
    save_qwen3_reranker,
    start_server,
    varied_texts,
)

BOUND = 1e-4
QUERY = "What does a vector database store?"


def candidates(count: int = 100, seed: int = 11) -> list[str]:
    """Documents of many lengths, a few past the model's limit (the document is what is cut)."""
    texts = varied_texts(400)
    rng = random.Random(seed)
    docs = [t for t in texts if t.strip()][:count]
    docs[3] = " ".join(texts[:60]) * 3  # past 512 tokens
    rng.shuffle(docs)
    return docs


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def assert_ranked_like(got: list[tuple[int, float]], expected: np.ndarray) -> None:
    """Every score within BOUND of the reference's, and the order the same up to ties closer than it."""
    scores = np.zeros(len(expected))
    for index, score in got:
        scores[index] = score
    assert sorted(i for i, _ in got) == list(range(len(expected)))
    assert np.abs(scores - expected).max() <= BOUND, np.abs(scores - expected).max()
    order = [i for i, _ in got]
    for a, b in zip(order, order[1:], strict=False):
        assert expected[a] >= expected[b] - BOUND, (a, b, expected[a], expected[b])


def post(server: Server, route: str, body: object) -> requests.Response:
    return requests.post(f"{server.url}{route}", json=body, timeout=120)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    folder = save_cross_encoder(tmp_path_factory.mktemp("models") / "ms-marco-tiny", "bert")
    server = start_server(tmp_path_factory.mktemp("logs"), "--model", str(folder), "--max-client-batch-size", "150")
    yield server, folder
    server.stop()


@pytest.fixture(scope="module")
def cross_encoder_reference(bert: tuple[Server, Path]) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(bert[1]), device="cpu")
    return model.predict([(QUERY, d) for d in candidates()])


def test_a_bert_cross_encoder_matches_cross_encoder_predict(bert, cross_encoder_reference) -> None:
    server, _ = bert
    response = post(server, "/rerank", {"query": QUERY, "texts": candidates(), "truncate": True})
    assert response.status_code == 200, response.text
    got = [(r["index"], r["score"]) for r in response.json()]
    assert_ranked_like(got, cross_encoder_reference)
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-inference-time"])


def test_tei_rerank_raw_scores_and_return_text(bert) -> None:
    server, folder = bert
    docs = candidates()[:5]
    body = {"query": QUERY, "texts": docs, "raw_scores": True, "return_text": True, "truncate": True}
    ranked = post(server, "/rerank", body).json()
    logits = classifier_logits(folder, [pair_ids(folder, QUERY, d) for d in docs])[:, 0]
    for r in ranked:
        assert abs(r["score"] - logits[r["index"]]) <= BOUND and r["text"] == docs[r["index"]]


def test_the_cohere_sdk_reranks_against_v2(bert, cross_encoder_reference) -> None:
    import cohere

    server, _ = bert
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    docs = candidates()
    result = client.rerank(model="ms-marco-tiny", query=QUERY, documents=docs, top_n=5)
    expected = np.argsort(-cross_encoder_reference, kind="stable")[:5]
    assert [r.index for r in result.results] == list(expected)
    for r in result.results:
        assert abs(r.relevance_score - cross_encoder_reference[r.index]) <= BOUND


def test_v1_rerank_takes_document_objects_and_returns_them(bert, cross_encoder_reference) -> None:
    server, _ = bert
    docs = candidates()[:10]
    body = {"query": QUERY, "documents": [{"text": d} for d in docs], "top_n": 3, "return_documents": True}
    answer = post(server, "/v1/rerank", body).json()
    assert len(answer["results"]) == 3 and answer["usage"]["total_tokens"] > 0
    for r in answer["results"]:
        assert r["document"]["text"] == docs[r["index"]]
        assert abs(r["relevance_score"] - cross_encoder_reference[r["index"]]) <= BOUND


def test_max_tokens_per_doc_shortens_the_document(bert) -> None:
    server, folder = bert
    doc = candidates()[0] + " and more words"
    capped = post(server, "/v2/rerank", {"query": QUERY, "documents": [doc], "max_tokens_per_doc": 3}).json()
    start = plain_tokenizer(folder).encode(doc, add_special_tokens=False).offsets[3][0]
    expected = sigmoid(classifier_logits(folder, [pair_ids(folder, QUERY, doc[:start])])[:, 0])
    assert abs(capped["results"][0]["relevance_score"] - expected[0]) <= BOUND


def test_predict_scores_texts_and_pairs_with_their_labels(bert) -> None:
    server, folder = bert
    single = post(server, "/predict", {"inputs": "A sentence to classify."}).json()
    assert single[0]["label"] == "LABEL_0" and 0 < single[0]["score"] < 1
    pairs = [[QUERY, "It stores embeddings."], [QUERY, "Bananas are yellow."]]
    batch = post(server, "/predict", {"inputs": pairs, "raw_scores": True}).json()
    logits = classifier_logits(folder, [pair_ids(folder, a, b) for a, b in pairs])[:, 0]
    assert [round(b[0]["score"], 4) for b in batch] == [round(float(x), 4) for x in logits]


def test_tulip_client_reranks_and_scores(bert, cross_encoder_reference) -> None:
    import tulip

    server, _ = bert
    client = tulip.Client(server.grpc)
    ranked = client.rerank(QUERY, candidates(), top_n=4)
    assert [i for i, _ in ranked] == list(np.argsort(-cross_encoder_reference, kind="stable")[:4])
    scores = client.score([(QUERY, d) for d in candidates()[:7]])
    assert scores.shape == (7,) and np.abs(scores - cross_encoder_reference[:7]).max() <= BOUND


@pytest.mark.parametrize(
    "route, body, status, message",
    [
        ("/rerank", {"query": QUERY, "texts": []}, 422, "cannot be empty"),
        ("/rerank", {"texts": ["a"]}, 422, "`query` cannot be empty"),
        ("/v2/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, 422, "`top_n` must be at least 1"),
        ("/v2/rerank", {"query": QUERY, "documents": [3]}, 422, "`documents[0]` must be a string"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 151}, 413, "at most 150"),
        ("/rerank", {"query": QUERY, "texts": ["word " * 600], "truncate": False}, 422, "longer than the model's"),
        ("/v1/embeddings", {"input": "hello"}, 400, "is a score model"),
        ("/embed", {"inputs": "hello"}, 400, "it answers /rerank"),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, 400, "is a score model"),
        ("/predict", {"inputs": 3}, 422, "must be a text"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem(bert, route, body, status, message) -> None:
    server, _ = bert
    response = post(server, route, body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    assert post(server, "/rerank", {"query": QUERY, "texts": ["still serving"]}).status_code == 200


def served_ranks(tmp_path: Path, folder: Path, docs: list[str]) -> list[tuple[int, float]]:
    """`docs` ranked against QUERY by a server of `folder`, over TEI's /rerank."""
    server = start_server(tmp_path, "--model", str(folder))
    try:
        got = post(server, "/rerank", {"query": QUERY, "texts": docs, "truncate": True}).json()
    finally:
        server.stop()
    return [(r["index"], r["score"]) for r in got]


def test_an_xlm_roberta_reranker_matches_transformers(tmp_path: Path) -> None:
    folder = save_cross_encoder(tmp_path / "bge-reranker-tiny", "xlm-roberta")
    docs = candidates(40)
    expected = sigmoid(classifier_logits(folder, [pair_ids(folder, QUERY, d) for d in docs])[:, 0])
    assert_ranked_like(served_ranks(tmp_path, folder, docs), expected)


def test_a_modernbert_cross_encoder_matches_cross_encoder_predict(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    folder = save_cross_encoder(tmp_path / "gte-reranker-modernbert-tiny", "modernbert")
    docs = candidates(40)
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, d) for d in docs])
    assert_ranked_like(served_ranks(tmp_path, folder, docs), expected)


def test_a_qwen3_reranker_scores_yes_against_no_as_published(tmp_path: Path) -> None:
    folder = save_qwen3_reranker(tmp_path / "qwen3-reranker-tiny")
    docs = candidates(30)
    server = start_server(tmp_path, "--model", str(folder), "--task", "score")
    try:
        got = post(server, "/v2/rerank", {"query": QUERY, "documents": docs}).json()["results"]
        own = post(server, "/v2/rerank", {"query": QUERY, "documents": docs[:3], "instruction": "Find fruit"}).json()
        info = requests.get(f"{server.url}/info", timeout=10).json()
    finally:
        server.stop()
    assert info["task"] == "score" and info["labels"] == ["relevance"]
    # Each request's pairs shared their prompt's head, which ran once (--shared-prefix on).
    assert info["engine"]["shared_prefix"]["steps"] >= 2 and info["engine"]["shared_prefix"]["tokens_saved"] > 0
    assert_ranked_like([(r["index"], r["relevance_score"]) for r in got], qwen3_reranker_scores(folder, QUERY, docs))
    expected = qwen3_reranker_scores(folder, QUERY, docs[:3], "Find fruit")
    assert_ranked_like([(r["index"], r["relevance_score"]) for r in own["results"]], expected)


def test_an_embedding_model_reranks_by_cosine_and_serves_similarity(server: Server) -> None:
    from sentence_transformers import SentenceTransformer

    import rose

    docs = candidates(20)
    model = SentenceTransformer(str(rose.default_model_path()), device="cpu")
    vectors = model.encode([QUERY, *docs], normalize_embeddings=True)
    expected = vectors[1:] @ vectors[0]
    got = post(server, "/rerank", {"query": QUERY, "texts": docs, "truncate": True}).json()
    assert_ranked_like([(r["index"], r["score"]) for r in got], expected)
    similarity = post(server, "/similarity", {"inputs": {"source_sentence": QUERY, "sentences": docs}}).json()
    assert np.abs(np.array(similarity) - expected).max() <= BOUND
    refused = post(server, "/predict", {"inputs": "hello"})
    assert refused.status_code == 400 and "is an embedding model" in refused.json()["error"]
