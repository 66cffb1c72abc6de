"""Qwen3 through `ivy-serve --model DIR` on the CPU, both kinds, with token-id input: float
vectors against Hugging Face transformers in float32, and pplx-embed's int8 and binary outputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from support import QWEN3_SEQUENCES as SEQUENCES
from support import Server, cosines, save_qwen3, start_server, transformers_pooled


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "bidirectional"])
def qwen3_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    root = tmp_path_factory.mktemp("qwen3")
    folder = save_qwen3(root / "tiny-qwen3", "tiny", request.param)
    server = start_server(tmp_path_factory.mktemp("logs"), "--model", str(folder))
    yield server, folder
    server.stop()


def test_served_over_http_with_token_ids(qwen3_server: tuple[Server, Path]) -> None:
    server, folder = qwen3_server
    response = requests.post(f"{server.url}/v1/embeddings", json={"input": SEQUENCES}, timeout=60)
    assert response.status_code == 200, response.text
    got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    assert cosines(got, transformers_pooled(folder, SEQUENCES).numpy()).min() >= 0.9999
    info = requests.get(f"{server.url}/info", timeout=10).json()
    assert info["model_type"] == "qwen3" and info["dimensions"] == 64


def test_int8_and_binary_outputs(qwen3_server: tuple[Server, Path]) -> None:
    server, folder = qwen3_server
    raw = transformers_pooled(folder, SEQUENCES)
    body = {"input": SEQUENCES, "encoding_format": "int8"}
    int8 = requests.post(f"{server.url}/v1/embeddings", json=body, timeout=60).json()
    got = np.array([d["embedding"] for d in int8["data"]])
    expected = torch.round(torch.tanh(raw) * 127).numpy()
    # float32 rounding may move a value across a .5 boundary: allow one step.
    assert np.abs(got - expected).max() <= 1 and (got == expected).mean() > 0.99
    body = {"input": SEQUENCES, "encoding_format": "binary"}
    binary = requests.post(f"{server.url}/v1/embeddings", json=body, timeout=60).json()
    bits = np.unpackbits(np.array([d["embedding"] for d in binary["data"]], dtype=np.uint8), axis=1)
    assert (bits == (raw.numpy() > 0)).mean() > 0.99
