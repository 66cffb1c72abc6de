"""The whole stack over HTTP: a real ivy-serve process, real clients, vectors checked against
sentence-transformers."""

from __future__ import annotations

import base64
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from support import Server, cosines, start_server

THRESHOLD = 0.9999


def post(server: Server, route: str, body: object, **kwargs: object) -> requests.Response:
    return requests.post(f"{server.url}{route}", json=body, timeout=120, **kwargs)


def openai_vectors(server: Server, inputs: object, **extra: object) -> np.ndarray:
    response = post(server, "/v1/embeddings", {"input": inputs, "model": "m", **extra})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    if extra.get("encoding_format") == "base64":
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def assert_matches(vectors: np.ndarray, reference: np.ndarray, texts: list[str]) -> None:
    sims = cosines(vectors, reference)
    assert sims.min() >= THRESHOLD, f"worst text: {texts[int(sims.argmin())]!r} at cosine {sims.min()}"


def test_openai_route_matches_sentence_transformers(server: Server, texts: list[str], reference: np.ndarray) -> None:
    assert_matches(openai_vectors(server, texts), reference, texts)


def test_openai_base64_is_the_same_vectors(server: Server, texts: list[str], reference: np.ndarray) -> None:
    assert_matches(openai_vectors(server, texts, encoding_format="base64"), reference, texts)


def test_openai_usage_counts_tokens(server: Server) -> None:
    body = post(server, "/v1/embeddings", {"input": ["hello world", "hi"]}).json()
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}  # [CLS] hello world [SEP] + [CLS] hi [SEP]
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"


def test_floats_are_written_as_float32(server: Server) -> None:
    # The shortest text that reads back to the same float32 (at most 9 significant digits), as
    # TEI's route writes them; not float64's 17 digits of the widened value.
    body = post(server, "/v1/embeddings", {"input": "hello world"}).text
    numbers = body.split('"embedding":[')[1].split("]")[0].split(",")
    digits = [len(t.lower().split("e")[0].lstrip("-").replace(".", "").lstrip("0")) for t in numbers]
    assert len(numbers) == 384 and max(digits) <= 9, max(digits)
    assert post(server, "/embed", {"inputs": "hello world"}).text.strip("[]").split(",") == numbers


def test_tei_route_matches_sentence_transformers(server: Server, texts: list[str], reference: np.ndarray) -> None:
    response = post(server, "/embed", {"inputs": texts, "truncate": True})
    assert response.status_code == 200, response.text
    assert_matches(np.array(response.json(), dtype=np.float32), reference, texts)
    for header in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-transfer-time"):
        assert float(response.headers[header]) >= 0


def test_normalize_and_matryoshka_dimensions(server: Server, texts: list[str], reference: np.ndarray) -> None:
    raw = np.array(post(server, "/embed", {"inputs": texts[:50], "normalize": False}).json(), dtype=np.float32)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    assert_matches(raw, reference[:50], texts[:50])
    short = np.array(post(server, "/embed", {"inputs": texts[:50], "dimensions": 64}).json(), dtype=np.float32)
    assert short.shape == (50, 64)
    expected = raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-5)
    assert openai_vectors(server, texts[:3], dimensions=8).shape == (3, 8)


def test_token_id_inputs_embed_like_the_text(server: Server, texts: list[str]) -> None:
    from tokenizers import Tokenizer

    import rose

    tokenizer = Tokenizer.from_file(str(rose.default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    # Ids are cut as they are, without re-adding [SEP]: compare texts within the model's limit.
    sample = [t for t in texts[8:60] if len(tokenizer.encode(t).ids) <= 256]
    ids = [tokenizer.encode(t).ids for t in sample]
    by_ids = openai_vectors(server, ids)
    assert cosines(by_ids, openai_vectors(server, sample)).min() >= 0.99999
    single = openai_vectors(server, ids[0])
    np.testing.assert_allclose(single[0], by_ids[0], atol=1e-6)


def test_tokenize_matches_the_model_tokenizer(server: Server) -> None:
    response = post(server, "/tokenize", {"inputs": ["Hello, world!", "é"]})
    assert response.status_code == 200, response.text
    first = response.json()[0]
    assert [t["id"] for t in first] == [101, 7592, 1010, 2088, 999, 102]
    assert first[0]["special"] and first[0]["start"] is None
    assert first[1] == {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5}


def test_info_health_and_metrics(server: Server) -> None:
    info = requests.get(f"{server.url}/info", timeout=10).json()
    assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (info["device"], info["attention_backend"], info["dimensions"]) == ("cpu", "sdpa", 384)
    assert info["max_input_length"] == 256
    assert info["tokenization_workers"] >= 1
    phases = {"read_weights", "build_model", "attention", "warmup", "fidelity_check"}
    assert set(info["engine"]["startup_seconds"]) == phases
    # The fused decoder: asked for (--fused-decoder auto) and in use (none for MiniLM on the CPU).
    assert info["fused_decoder"] == "off" and info["engine"]["fused_decoder"] == {"requested": "auto", "kernel": None}
    # --fused-swiglu auto, which MiniLM cannot take (no SwiGLU).
    swiglu = info["engine"]["fused_swiglu"]
    assert (swiglu["mode"], swiglu["state"]) == ("auto", "unsupported")
    assert swiglu["why"] == "the model has no 16-bit SwiGLU product"
    qk_rope = info["engine"]["fused_qk_rope"]  # --fused-qk-rope auto: MiniLM has no QK-norm
    assert (qk_rope["mode"], qk_rope["state"], qk_rope["weight_copy_bytes"]) == ("auto", "unsupported", 0)
    assert qk_rope["why"] == "the model has no 16-bit QKV product with per-head QK-norm"
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    post(server, "/embed", {"inputs": "warm the counters"})
    metrics = requests.get(f"{server.url}/metrics", timeout=10).text
    for name in (
        "ivy_requests_total",
        "ivy_tokenization_duration_seconds",
        "ivy_tokenizer_busy_microseconds_total",
        "tulip_batch_tokens",
        "tulip_step_duration_seconds",
    ):
        assert name in metrics
    # Counts get buckets of counts (a time's would put every step in +Inf).
    assert 'tulip_batch_tokens_bucket{le="4096"}' in metrics
    assert 'tulip_batch_sequences_bucket{le="1"}' in metrics


def test_openai_sdk(server: Server, texts: list[str], reference: np.ndarray) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    result = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts[:20])
    vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert_matches(vectors, reference[:20], texts[:20])
    assert client.models.list().data[0].id == "sentence-transformers/all-MiniLM-L6-v2"


BAD_REQUESTS = [
    ("/v1/embeddings", {"input": []}, 422, "validation", "cannot be empty"),
    ("/embed", {"inputs": []}, 422, "validation", "cannot be empty"),
    ("/v1/embeddings", {"input": ""}, 422, "validation", "input 0 is an empty string"),
    ("/v1/embeddings", {"input": ["fine", ""]}, 422, "validation", "input 1 is an empty string"),
    ("/v1/embeddings", {"input": ["fine", 3.5]}, 422, "validation", "`input[1]` must be a string"),
    ("/v1/embeddings", {"input": ["fine", {"text": "x"}]}, 422, "validation", "`input[1]` must be a string"),
    ("/embed", {"inputs": "word " * 400, "truncate": False}, 422, "validation", "longer than the model's limit of 256"),
    ("/v1/embeddings", {"input": [101] * 300, "dimensions": 4}, 200, None, None),  # auto-truncated ids
    ("/embed", {"inputs": [[101] * 300], "truncate": False}, 422, "validation", "300 tokens, more than"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, 422, "validation", "between 1 and 384"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, 422, "validation", "between 1 and 384"),
    ("/embed", {"inputs": "x", "dimensions": -1}, 422, "validation", "between 1 and 384"),
    ("/v1/embeddings", {"input": [101, 30522, 102]}, 422, "validation", "token id 30522"),
    ("/v1/embeddings", {"input": [[101, 102], [-1]]}, 422, "validation", "`input[1][0]` must be a non-negative"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int4"}, 422, "validation", "encoding_format"),
    ("/embed", {"inputs": "x", "truncation_direction": "up"}, 422, "validation", "truncation_direction"),
    ("/embed", {"inputs": "x", "prompt_name": "query"}, 422, "validation", "defines no prompts"),
    ("/v1/embeddings", {"model": "m"}, 422, "validation", "`input` is required"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, 422, "validation", "normalize"),
    ("/v1/embeddings", {"input": ["a"] * 2049}, 413, "payload_too_large", "at most 2048"),
]


@pytest.mark.parametrize("route, body, status, error_type, message", BAD_REQUESTS)
def test_bad_input_gets_a_named_4xx_and_the_server_keeps_serving(
    server: Server, route: str, body: object, status: int, error_type: str | None, message: str | None
) -> None:
    response = post(server, route, body)
    assert response.status_code == status, response.text
    if error_type is not None:
        error = response.json()
        assert error["error_type"] == error_type
        assert message in error["error"]
    assert post(server, "/embed", {"inputs": "still serving"}).status_code == 200


def raw_post(server: Server, data: bytes, content_type: str | None) -> requests.Response:
    headers = {"content-type": content_type} if content_type else {}
    return requests.post(f"{server.url}/v1/embeddings", data=data, headers=headers, timeout=60)


@pytest.mark.parametrize(
    "data, content_type, status, error_type",
    [
        (b'{"input": "x"', "application/json", 400, "invalid_json"),
        (b"input=x", "application/json", 400, "invalid_json"),
        (b'{"input": "x"}', "text/plain", 415, "unsupported_media_type"),
        (b'{"input": "x"}', None, 415, "unsupported_media_type"),
        (json.dumps({"input": "y" * 2_100_000}).encode(), "application/json", 413, "payload_too_large"),
    ],
)
def test_malformed_bodies(server: Server, data: bytes, content_type: str | None, status: int, error_type: str) -> None:
    response = raw_post(server, data, content_type)
    assert response.status_code == status, response.text
    assert response.json()["error_type"] == error_type
    assert post(server, "/embed", {"inputs": "still serving"}).status_code == 200


def test_64_concurrent_clients_get_their_own_vectors(server: Server, texts: list[str], reference: np.ndarray) -> None:
    def client(i: int) -> float:
        picks = [j % len(texts) for j in range(i, i + 7 * 64, 64)]
        if i % 2:
            vectors = openai_vectors(server, [texts[j] for j in picks])
        else:
            response = post(server, "/embed", {"inputs": [texts[j] for j in picks]})
            assert response.status_code == 200, response.text
            vectors = np.array(response.json(), dtype=np.float32)
        return float(cosines(vectors, reference[picks]).min())

    with ThreadPoolExecutor(max_workers=64) as pool:
        worst = min(pool.map(client, range(64)))
    assert worst >= THRESHOLD


def test_sigterm_ends_the_server_with_status_0(tmp_path: Path) -> None:
    """systemd and Kubernetes stop servers with SIGTERM: a clean stop must not read as a crash."""
    server = start_server(tmp_path)
    try:
        # After serving, when the engine thread has started torch's threads.
        texts = [f"a short sentence number {i}" for i in range(64)]
        assert post(server, "/v1/embeddings", {"input": texts}).status_code == 200
        server.process.terminate()
        assert server.process.wait(timeout=60) == 0, server.log.read_text()[-2000:]
    finally:
        server.stop()


def test_help_lists_every_engine_flag_with_its_variable() -> None:
    out = subprocess.run(["ivy-serve", "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--fused-decoder <FUSED_DECODER>" in out and "[env: FUSED_DECODER=]" in out
    assert "[possible values: auto, cuda, triton, off]" in out


def test_decode_turns_token_ids_back_into_text(server: Server) -> None:
    ids = post(server, "/tokenize", {"inputs": "Hello, world!"}).json()[0]
    one = [t["id"] for t in ids]
    assert post(server, "/decode", {"ids": one}).json() == "hello, world!"
    assert post(server, "/decode", {"ids": [one], "skip_special_tokens": False}).json() == ["[CLS] hello, world! [SEP]"]
    bad = post(server, "/decode", {"ids": [1, 99999]})
    assert bad.status_code == 422 and "token id 99999" in bad.json()["error"]


def test_every_answer_says_what_it_computed_and_where_its_time_went(server: Server) -> None:
    text = "Where did the time go?"
    headers = post(server, "/embed", {"inputs": [text, "é"]}).headers
    assert int(headers["x-compute-characters"]) == len(text) + 1 and int(headers["x-compute-tokens"]) > 2
    parts = [float(headers[f"x-{p}-time"]) for p in ("tokenization", "queue", "inference")]
    assert float(headers["x-total-time"]) >= float(headers["x-compute-time"]) >= max(parts)
