"""Qwen3 on the CPU: both kinds (causal Qwen3-Embedding, bidirectional pplx-embed) in a small
shape, in-process and through `ivy-serve --model DIR` with token-id input, against Hugging Face
transformers in float32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

import rose
from models import save_qwen3, transformers_pooled
from rose import kernels
from support import Server, cosines, start_server

SEQUENCES = [[101, 2023, 2003, 102], [7592], [101] + list(range(2000, 2300)) + [102], [5, 6, 7, 8, 9, 10, 11]]


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("prefix, top_level_rope", [("", False), ("model.", True)], ids=["plain", "prefixed"])
def test_in_process_matches_transformers(tmp_path: Path, bidirectional: bool, prefix: str, top_level_rope: bool):
    ours_dir = save_qwen3(tmp_path / "ours", "tiny", bidirectional, prefix, top_level_rope)
    hf_dir = save_qwen3(tmp_path / "hf", "tiny", bidirectional)
    engine = rose.Engine(ours_dir, device="cpu")
    assert engine.pooling == ("mean" if bidirectional else "last")
    assert engine.model.attention_spec.causal is not bidirectional
    ours = engine.embed_ids(SEQUENCES, normalize=False)
    expected = transformers_pooled(hf_dir, SEQUENCES).numpy()
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-3)


def test_the_two_kinds_differ(tmp_path: Path) -> None:
    causal = rose.Engine(save_qwen3(tmp_path / "c", "tiny", False), device="cpu", pooling="mean")
    bidirectional = rose.Engine(save_qwen3(tmp_path / "b", "tiny", True), device="cpu")
    assert cosines(causal.embed_ids(SEQUENCES[:1]), bidirectional.embed_ids(SEQUENCES[:1])).max() < 0.999


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


def test_torch_kernels_follow_transformers() -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    torch.manual_seed(0)
    x = torch.randn(7, 3, 16)
    norm = Qwen3RMSNorm(16, eps=1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    torch.testing.assert_close(kernels.rmsnorm(x, norm.weight.data, 1e-6), norm(x))
    q, k = torch.randn(7, 4, 16), torch.randn(7, 2, 16)
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 5], dtype=torch.int32)
    cache = kernels.rope_cache(16, 64, 1e6, torch.device("cpu"))
    cos, sin = cache[positions.long()].chunk(2, -1)
    cos, sin = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    eq, ek = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    kernels.apply_rope(q, k, positions, cache)
    torch.testing.assert_close(q, eq[0].transpose(0, 1))
    torch.testing.assert_close(k, ek[0].transpose(0, 1))
