"""API keys (--api-key, --api-key-file, API_KEY): every route closed but the probes, over HTTP
(requests, the OpenAI and Cohere SDKs) and gRPC (tulip.Client); keys never in a log, /info or an
error; per-key limits that hold one key back while another is served."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import cohere
import numpy as np
import openai
import pytest
import requests

import tulip
from support import Server, start_server
from tulip.reindex import read

KEY, OTHER, FROM_FILE = "sk-test-7f3a9c", "sk-other-19be42", "sk-file-55d0e1"

# Every route with a body it accepts from an embedding model (or refuses as a client error).
ROUTES = [
    ("POST", "/v1/embeddings", {"input": "hello"}),
    ("GET", "/v1/models", None),
    ("POST", "/v2/embed", {"texts": ["hello"], "input_type": "search_query", "embedding_types": ["float"]}),
    ("POST", "/embed", {"inputs": "hello"}),
    ("POST", "/embed_sparse", {"inputs": "hello"}),
    ("POST", "/tokenize", {"inputs": "hello"}),
    ("POST", "/decode", {"ids": [101, 102]}),
    ("POST", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
    ("POST", "/predict", {"inputs": "a"}),
    ("POST", "/rerank", {"query": "a", "texts": ["b"]}),
    ("POST", "/v1/rerank", {"query": "a", "documents": ["b"]}),
    ("POST", "/v2/rerank", {"query": "a", "documents": ["b"]}),
    ("GET", "/info", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs/", None),
    ("GET", "/no-such-route", None),
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("keys")
    keys = folder / "keys.txt"
    keys.write_text(f"# a comment\n{FROM_FILE}\n")
    server = start_server(folder, "--api-key", f"{KEY},{OTHER}", "--api-key-file", str(keys))
    yield server
    server.stop()


def call(server: Server, method: str, route: str, body: object, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, server.url + route, json=body, headers=headers, timeout=60)


def test_every_route_needs_a_key_but_the_probes(keyed: Server) -> None:
    for method, route, body in ROUTES:
        for key in (None, "sk-wrong", KEY[:-1]):
            answer = call(keyed, method, route, body, key)
            assert answer.status_code == 401, (route, key, answer.status_code)
            assert answer.json()["error_type"] == "unauthorized", route
            assert answer.headers["www-authenticate"] == "Bearer"
            assert answer.headers["x-request-id"]
        for key in (KEY, OTHER, FROM_FILE):
            answer = call(keyed, method, route, body, key)
            assert answer.status_code != 401 and answer.status_code < 500, (route, answer.status_code, answer.text)
    assert call(keyed, "POST", "/v1/embeddings", {"input": "hello"}, KEY).status_code == 200
    for probe in ("/health", "/live"):
        assert requests.get(keyed.url + probe, timeout=10).status_code == 200
    # The scheme is Bearer and nothing else.
    basic = requests.post(keyed.url + "/embed", json={"inputs": "a"}, headers={"Authorization": KEY}, timeout=10)
    assert basic.status_code == 401


def test_the_sdks_send_their_key(keyed: Server) -> None:
    client = openai.OpenAI(api_key=KEY, base_url=f"{keyed.url}/v1")
    vectors = client.embeddings.create(model="any", input=["a query"]).data
    assert len(vectors) == 1 and len(vectors[0].embedding) == 384
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="sk-wrong", base_url=f"{keyed.url}/v1").embeddings.create(model="any", input="a")
    answer = cohere.ClientV2(api_key=OTHER, base_url=keyed.url).embed(
        texts=["a query"], model="any", input_type="search_query", embedding_types=["float"]
    )
    assert len(answer.embeddings.float_[0]) == 384
    with pytest.raises(cohere.core.ApiError) as refused:
        cohere.ClientV2(api_key="sk-wrong", base_url=keyed.url).embed(
            texts=["a"], model="any", input_type="search_query", embedding_types=["float"]
        )
    assert refused.value.status_code == 401


def test_grpc_needs_the_key_in_its_metadata(keyed: Server) -> None:
    with pytest.raises(Exception, match="(?i)api key"):
        tulip.Client(keyed.grpc)
    with pytest.raises(Exception, match="(?i)api key"):
        tulip.Client(keyed.grpc, api_key="sk-wrong")
    client = tulip.Client(keyed.grpc, api_key=FROM_FILE)
    over_http = call(keyed, "POST", "/embed", {"inputs": ["a query"]}, KEY).json()
    assert np.allclose(client.embed(["a query"]), np.array(over_http), atol=1e-5)


def test_keys_are_counted_and_never_shown(keyed: Server) -> None:
    call(keyed, "POST", "/embed", {"inputs": "a"}, "sk-wrong")
    metrics = call(keyed, "GET", "/metrics", None, KEY).text
    assert 'ivy_auth_failures_total{reason="wrong"}' in metrics
    assert 'ivy_auth_failures_total{reason="missing"}' in metrics
    assert 'tulip_auth_failures_total{reason="missing"}' in metrics  # tulip.Client without a key
    info = call(keyed, "GET", "/info", None, KEY).json()
    assert info["api_keys"] == 3
    shown = metrics + str(info) + call(keyed, "POST", "/embed", {"inputs": "a"}, "sk-wrong").text
    log = keyed.log.read_text()
    for key in (KEY, OTHER, FROM_FILE):
        assert key not in shown and key not in log
    help_text = subprocess.run(["ivy-serve", "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    security = help_text.split("\nSecurity:")[1]
    assert "--api-key " in security and "--api-key-file" in security and "--api-key-tokens-per-minute" in security


def test_a_key_past_its_limits_waits_while_another_is_served(tmp_path: Path) -> None:
    server = start_server(
        tmp_path, "--api-key", f"{KEY},{OTHER}", "--api-key-requests-per-second", "2",
        "--api-key-tokens-per-minute", "600",
    )  # fmt: skip
    try:
        body = {"inputs": ["a short query"]}
        answers = [call(server, "POST", "/embed", body, KEY) for _ in range(6)]
        limited = [a for a in answers if a.status_code == 429]
        assert limited and all(a.status_code in (200, 429) for a in answers)
        assert limited[0].json()["error_type"] == "rate_limited"
        assert int(limited[0].headers["retry-after"]) >= 1
        assert call(server, "POST", "/embed", body, OTHER).status_code == 200
        # Tokens: 600 a minute, 10 a second; an answer of ~1,000 tokens overdraws the key for
        # about 40 s, and the other key's budget is its own.
        time.sleep(1.1)
        long = {"inputs": ["word " * 250] * 4, "truncate": True}
        assert call(server, "POST", "/embed", long, KEY).status_code == 200
        time.sleep(1.1)
        refused = call(server, "POST", "/embed", body, KEY)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 10
        assert call(server, "POST", "/embed", body, OTHER).status_code == 200
    finally:
        server.stop()


def test_workers_accept_ivys_key_and_refuse_others(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--api-key", KEY, "--devices", "cpu", "--replicas", "1", timeout=300)
    try:
        assert call(server, "POST", "/embed", {"inputs": "a"}, KEY).status_code == 200
        worker = requests.get(f"{server.url}/info", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        address = worker.json()["replicas"][0]["url"].removeprefix("http://")
        with pytest.raises(Exception, match="(?i)api key"):
            tulip.Client(address)
        assert tulip.Client(address, api_key=KEY).embed(["a"]).shape == (1, 384)
        assert KEY not in server.log.read_text()
    finally:
        server.stop()


def test_ivy_embed_sends_its_key(keyed: Server, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("first document\nsecond document\n")
    command = ["ivy-embed", str(corpus), "--server", keyed.url, "--output-format", "npy"]
    env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
    refused = subprocess.run([*command, "--output", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert refused.returncode == 1 and "401" in refused.stderr
    done = subprocess.run(
        [*command, "--output", str(tmp_path / "b")], capture_output=True, text=True, env={**env, "API_KEY": OTHER}
    )
    assert done.returncode == 0, done.stderr
    assert read(tmp_path / "b").vectors.shape == (2, 384)
