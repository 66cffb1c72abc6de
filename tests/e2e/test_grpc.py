"""The gRPC API through tulip.Client, against a real ivy-serve process, and Ivy in front of a
Tulip in another process (ivy-serve --tulip-endpoint before tulip-serve)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import requests

import tulip
from support import Server, cosines, free_port, start_server


@pytest.fixture(scope="module")
def client(server: Server) -> tulip.Client:
    return tulip.Client(server.grpc)


def test_vectors_match_sentence_transformers(client: tulip.Client, texts: list[str], reference: np.ndarray) -> None:
    vectors = client.embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), 384)
    sims = cosines(vectors, reference)
    assert sims.min() >= 0.9999, f"worst text: {texts[int(sims.argmin())]!r} at cosine {sims.min()}"


def test_token_ids_text_and_single_inputs(client: tulip.Client) -> None:
    by_text = client.embed(["hello world"])
    by_ids = client.embed([[101, 7592, 2088, 102]])
    np.testing.assert_allclose(by_ids, by_text, atol=1e-6)
    np.testing.assert_allclose(client.embed("hello world"), by_text, atol=1e-6)
    np.testing.assert_allclose(client.embed([101, 7592, 2088, 102]), by_text, atol=1e-6)


def test_dimensions_and_normalize(client: tulip.Client) -> None:
    raw = client.embed(["some text"], normalize=False)
    short = client.embed(["some text"], dimensions=32)
    np.testing.assert_allclose(short[0], raw[0, :32] / np.linalg.norm(raw[0, :32]), atol=1e-6)


def test_info_describes_the_model(client: tulip.Client) -> None:
    info = client.info()
    assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (info["dimensions"], info["max_input_length"], info["pooling"]) == (384, 256, "mean")
    assert info["device"] == "cpu"


@pytest.mark.parametrize(
    "inputs, kwargs, message",
    [
        ([], {}, "cannot be empty"),
        ([""], {}, "empty string"),
        ([[101, 99999]], {}, "outside the model's vocabulary"),
        (["word " * 400], {"truncate": False}, "longer than the model's limit"),
        (["x"], {"dimensions": 999}, "between 1 and 384"),
    ],
)
def test_bad_input_raises_value_error(client: tulip.Client, inputs: list, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        client.embed(inputs, **kwargs)
    assert client.embed(["still serving"]).shape == (1, 384)


def test_an_unreachable_server_raises_connection_error() -> None:
    with pytest.raises(ConnectionError):
        tulip.Client("127.0.0.1:1", timeout=0.5)


METRICS_PORT = free_port()
"""Where the remote tulip-serve serves its metrics (--metrics-port)."""


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """ivy-serve fronting a tulip-serve process: Ivy reaches it over gRPC only."""
    logs = tmp_path_factory.mktemp("remote")
    grpc_port = free_port()
    command = ["tulip-serve", "--hostname", "127.0.0.1", "--grpc-port", str(grpc_port),
               "--metrics-port", str(METRICS_PORT)]  # fmt: skip
    env = {**os.environ, "DEVICE": os.environ.get("DEVICE", "cpu")}
    with (logs / "tulip-serve.log").open("w") as log:
        tulip_serve = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        front = start_server(logs, "--tulip-endpoint", f"http://127.0.0.1:{grpc_port}", "--auto-truncate")
        yield front
        front.stop()
    finally:
        tulip_serve.terminate()
        tulip_serve.wait(timeout=30)


def test_ivy_in_front_of_a_remote_tulip_answers_as_the_in_process_one(
    remote: Server, server: Server, texts: list[str]
) -> None:
    def embed(at: Server, inputs: list) -> requests.Response:
        return requests.post(f"{at.url}/v1/embeddings", json={"input": inputs}, timeout=60)

    def vectors(at: Server) -> np.ndarray:
        return np.array([row["embedding"] for row in embed(at, texts[:40]).json()["data"]])

    assert cosines(vectors(remote), vectors(server)).min() >= 0.9999
    # A client's mistake is a 4xx naming it, and the requests after it are served.
    bad = embed(remote, [[101, 99999]])
    assert bad.status_code == 422 and "vocabulary" in bad.json()["error"]
    assert embed(remote, ["still serving"]).status_code == 200


def test_a_remote_tulip_serves_its_own_step_metrics(remote: Server) -> None:
    requests.post(f"{remote.url}/v1/embeddings", json={"input": ["count this step"]}, timeout=60).raise_for_status()
    response = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    steps = re.search(r"^tulip_batch_tokens_count (\d+)$", response.text, re.M)
    assert steps is not None and int(steps.group(1)) >= 1, response.text[:2000]
    assert "tulip_step_duration_seconds_bucket" in response.text
    assert "ivy_requests_total" not in response.text  # Tulip's own, not the gateway's
