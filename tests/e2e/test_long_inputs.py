"""Inputs longer than the model (`--long-inputs chunk`, or a request's `long_inputs`): windows of
the model's limit sharing --chunk-overlap tokens, each embedded, combined by a token-weighted
mean then normalized; checked against the same windows embedded one by one and combined by that
rule. Usage counts every window's tokens; the limits still hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from tokenizers import Tokenizer

import rose
from support import Server, classifier_logits, pair_ids, plain_tokenizer, save_cross_encoder, start_server, varied_texts

OVERLAP = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("long")
    server = start_server(folder, "--long-inputs", "chunk", "--chunk-overlap", str(OVERLAP),
                          "--max-request-tokens", "2000")  # fmt: skip
    yield server
    server.stop()


def windows(text: str) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(rose.default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256, stride=OVERLAP)
    encoding = tokenizer.encode(text)
    return [encoding.ids] + [o.ids for o in encoding.overflowing]


LONG = " ".join(" ".join(varied_texts(40)).split()[:500])


def test_a_long_input_is_the_token_weighted_mean_of_its_windows(server: Server) -> None:
    expected_windows = windows(LONG)
    assert len(expected_windows) >= 3 and all(len(w) <= 256 for w in expected_windows)
    raw = requests.post(f"{server.url}/embed", json={"inputs": expected_windows, "normalize": False}, timeout=60)
    assert raw.status_code == 200, raw.text
    weights = np.array([len(w) for w in expected_windows], dtype=np.float64)
    mean = (np.array(raw.json()) * weights[:, None]).sum(0) / weights.sum()
    mean /= np.linalg.norm(mean)
    answer = requests.post(f"{server.url}/v1/embeddings", json={"input": [LONG, "a short one"]}, timeout=60)
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json()["data"][0]["embedding"])
    assert float(got @ mean) >= 0.99999
    short = requests.post(f"{server.url}/v1/embeddings", json={"input": "a short one"}, timeout=60).json()
    assert np.allclose(answer.json()["data"][1]["embedding"], short["data"][0]["embedding"], atol=1e-6)
    assert answer.json()["usage"]["prompt_tokens"] == int(weights.sum()) + short["usage"]["prompt_tokens"]
    info = requests.get(f"{server.url}/info", timeout=10).json()
    assert info["long_inputs"] == "chunk" and info["chunk_overlap"] == OVERLAP


def test_a_request_may_truncate_instead_and_limits_hold(server: Server) -> None:
    cut = requests.post(f"{server.url}/embed", json={"inputs": LONG, "long_inputs": "truncate", "truncate": True})
    first = requests.post(f"{server.url}/embed", json={"inputs": [windows(LONG)[0]]}, timeout=60)
    assert np.allclose(cut.json(), first.json(), atol=1e-6)
    refused = requests.post(f"{server.url}/embed", json={"inputs": LONG, "long_inputs": "truncate"}, timeout=60)
    assert refused.status_code == 422 and "longer than the model's limit" in refused.json()["error"]
    too_many = requests.post(f"{server.url}/embed", json={"inputs": [LONG] * 3}, timeout=60)
    assert too_many.status_code == 413 and "--max-request-tokens" in too_many.json()["error"], too_many.text
    wrong = requests.post(f"{server.url}/embed", json={"inputs": "x", "long_inputs": "split"}, timeout=60)
    assert 400 <= wrong.status_code < 500 and "long_inputs" in wrong.json()["error"], wrong.text


def test_the_default_server_chunks_when_a_request_asks(tmp_path: Path) -> None:
    plain = start_server(tmp_path)
    try:
        assert requests.post(f"{plain.url}/embed", json={"inputs": LONG}, timeout=60).status_code == 422
        chunked = requests.post(f"{plain.url}/embed", json={"inputs": LONG, "long_inputs": "chunk"}, timeout=60)
        assert chunked.status_code == 200 and len(chunked.json()[0]) == 384
    finally:
        plain.stop()


def test_a_reranker_scores_a_long_document_by_its_best_window(tmp_path: Path) -> None:
    folder = save_cross_encoder(tmp_path / "cross-encoder")
    server = start_server(tmp_path, "--model", str(folder), "--long-inputs", "chunk")
    try:
        query = "what is the passage about"
        body = {"query": query, "texts": [LONG, "a short document"], "raw_scores": True}
        answer = requests.post(f"{server.url}/rerank", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        got = {r["index"]: r["score"] for r in answer.json()}
    finally:
        server.stop()
    tokenizer = plain_tokenizer(folder)
    tokenizer.enable_truncation(512, stride=32, strategy="only_second")
    encoding = tokenizer.encode(query, LONG)
    windows = [(w.ids, w.type_ids) for w in [encoding, *encoding.overflowing]]
    assert len(windows) >= 2
    logits = classifier_logits(folder, windows)[:, 0]
    assert abs(got[0] - float(logits.max())) < 1e-4, (got[0], logits)
    short = classifier_logits(folder, [pair_ids(folder, query, "a short document")])[0, 0]
    assert abs(got[1] - float(short)) < 1e-4
