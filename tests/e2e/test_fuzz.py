"""Fuzzing a real ivy-serve with Hypothesis (property-based; it shrinks a failure to its smallest
body): bodies for every POST route, made by mutating a valid one (a value replaced by arbitrary
JSON, a key dropped or added, deep nesting, long strings, lone surrogates, truncated or non-UTF-8
bytes), and malformed gRPC messages for each Tulip RPC (valid protobuf fields mutated at the byte
level, and random bytes). The property: no answer of 500 or more (gRPC: no INTERNAL, UNKNOWN or
DATA_LOSS), the process alive, and the server still correct afterwards.

    pytest tests/e2e/test_fuzz.py                           # the quick run (CI)
    pytest tests/e2e/test_fuzz.py --fuzz-examples 10000     # the long one: 10,000 of each
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import Server, save_cross_encoder, save_splade, start_server

VALID = {
    "/v1/embeddings": {"input": ["hello world", "a second text"], "model": "m", "encoding_format": "float",
                       "dimensions": 32},
    "/embed": {"inputs": ["hello world"], "normalize": True, "truncate": True, "prompt_name": None},
    "/embed_sparse": {"inputs": ["hello world"], "truncate": True, "top_k": 8, "min_value": 0.1},
    "/embed_all": {"inputs": ["hello world"], "truncate": True},
    "/encode": {"inputs": ["hello world"], "outputs": ["dense", "tokens"], "normalize": True},
    "/v2/embed": {"texts": ["hello"], "model": "m", "input_type": "search_query", "embedding_types": ["float"]},
    "/tokenize": {"inputs": ["hello world"], "add_special_tokens": True},
    "/decode": {"ids": [101, 7592, 2088, 102], "skip_special_tokens": True},
    "/similarity": {"inputs": {"source_sentence": "a cat", "sentences": ["a dog", "a car"]}},
    "/predict": {"inputs": [["a question", "an answer"]]},
    "/rerank": {"query": "what is a cat", "texts": ["a cat is an animal", "a car"], "return_text": True},
    "/v1/rerank": {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "model": "m"},
    "/v2/rerank": {"query": "q", "documents": ["a", "b"], "top_n": 2, "model": "m", "max_tokens_per_doc": 64},
}  # fmt: skip
SCORING_ROUTES = ("/predict", "/rerank", "/v1/rerank", "/v2/rerank")
SPARSE_ROUTES = ("/embed_sparse",)


def server_for(route: str) -> str:
    """Which of the fuzzed servers serves `route`: a cross-encoder, a SPLADE model or the default embedder."""
    return "score" if route in SCORING_ROUTES else "sparse" if route in SPARSE_ROUTES else "embed"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
special_text = st.sampled_from(["", " ", "\ud800", "\x00", "é" * 5000, "word " * 3000, "🦀" * 100, "\n\t"])


@st.composite
def mutated(draw: st.DrawFn, valid: dict) -> bytes:
    """A valid body with one to three mutations, serialized; or bytes that are not JSON at all."""
    body = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        keys = sorted(body) if isinstance(body, dict) else []
        kind = draw(st.sampled_from(["replace", "drop", "add", "text", "nest", "whole"]))
        if kind == "replace" and keys:
            body[draw(st.sampled_from(keys))] = draw(json_values)
        elif kind == "drop" and keys:
            body.pop(draw(st.sampled_from(keys)))
        elif kind == "add" and isinstance(body, dict):
            body[draw(st.text(max_size=12))] = draw(json_values)
        elif kind == "text" and keys:
            body[draw(st.sampled_from(keys))] = draw(special_text | st.lists(special_text, max_size=4))
        elif kind == "nest" and keys:
            body[draw(st.sampled_from(keys))] = f"@nest{draw(st.integers(10, 5000))}@"
        elif kind == "whole":
            body = draw(json_values)
    text = json.dumps(body)
    # Deep nesting written out after json.dumps, which would recurse as deep.
    for depth in set(re.findall(r'"@nest(\d+)@"', text)):
        text = text.replace(f'"@nest{depth}@"', "[" * int(depth) + '"x"' + "]" * int(depth))
    raw = text.encode("utf-8", "surrogatepass")
    ending = draw(st.sampled_from(["as is", "as is", "as is", "truncate", "bad utf-8", "bytes"]))
    if ending == "truncate":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    if ending == "bad utf-8":
        cut = draw(st.integers(0, len(raw)))
        return raw[:cut] + b"\xff\xfe\xc3" + raw[cut:]
    if ending == "bytes":
        return draw(st.binary(max_size=200))
    return raw


def examples(config: pytest.Config, share: int) -> int:
    return max(1, config.getoption("--fuzz-examples") // share)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("fuzz")
    embedder = start_server(logs, "--auto-truncate")
    scorer = start_server(logs, "--model", str(save_cross_encoder(logs / "ce")))
    sparse = start_server(logs, "--model", str(save_splade(logs / "splade")), "--auto-truncate")
    yield {"embed": embedder, "score": scorer, "sparse": sparse}
    for server in (embedder, scorer, sparse):
        alive = server.process.poll() is None
        server.stop()
        assert alive, server.log.read_text()[-3000:]
        assert "panicked" not in server.log.read_text()


@pytest.mark.parametrize("route", list(VALID))
def test_mutated_http_bodies_never_get_a_5xx(
    route: str, servers: dict[str, Server], request: pytest.FixtureRequest
) -> None:
    server = servers[server_for(route)]
    session = requests.Session()
    seen: dict[int, int] = {}

    @settings(max_examples=examples(request.config, len(VALID)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=mutated(VALID[route]))
    def check(body: bytes) -> None:
        answer = session.post(f"{server.url}{route}", data=body, headers={"content-type": "application/json"},
                              timeout=120)  # fmt: skip
        seen[answer.status_code] = seen.get(answer.status_code, 0) + 1
        assert answer.status_code < 500, (answer.status_code, answer.text[:300], body[:300])
        if answer.status_code >= 400:
            assert "error" in answer.json(), answer.text[:300]

    check()
    assert any(code >= 400 for code in seen), seen  # the mutations did reach the validation
    valid = session.post(f"{server.url}{route}", json=VALID[route], timeout=60)
    assert valid.status_code == 200, (route, valid.text)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def packed(field: int, values: list[int]) -> bytes:
    body = b"".join(varint(v) for v in values)
    return varint(field << 3 | 2) + varint(len(body)) + body


RPCS = {
    # Embed: token_ids, lengths, normalize, dimensions; Score: token_ids, lengths, raw_scores.
    "Embed": packed(1, [101, 7592, 2088, 102]) + packed(2, [4]) + varint(3 << 3) + varint(1),
    "Score": packed(1, [101, 7592, 102, 2088, 102]) + packed(2, [5]) + packed(3, [0, 0, 0, 1, 1]),
    "Info": b"",
    "Tokenizer": b"",
}
FAILURES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}


@st.composite
def malformed(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` with bytes flipped, cut, inserted or fields appended (huge varints, wrong wire
    types, lengths past the end), or random bytes."""
    kind = draw(st.sampled_from(["flip", "cut", "insert", "append", "random"]))
    data = bytearray(valid)
    if kind == "flip" and data:
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=12))
    elif kind == "append":
        field = draw(st.integers(1, 40))
        wire = draw(st.sampled_from([0, 1, 2, 5, 3, 7]))
        tail = draw(st.sampled_from([varint(2**64 - 1), varint(10**6), struct.pack("<d", 1.5), b"\xff" * 11]))
        data += varint(field << 3 | wire) + tail
    else:
        data = bytearray(draw(st.binary(max_size=300)))
    return bytes(data)


@pytest.mark.parametrize("rpc", list(RPCS))
def test_malformed_grpc_messages_never_fail_inside(
    rpc: str, servers: dict[str, Server], request: pytest.FixtureRequest
) -> None:
    server = servers["score" if rpc == "Score" else "embed"]
    channel = grpc.insecure_channel(server.grpc)
    call = channel.unary_unary(f"/tulip.v1.Tulip/{rpc}", request_serializer=None, response_deserializer=None)
    assert call(RPCS[rpc], timeout=30)  # the valid message is answered

    @settings(max_examples=examples(request.config, len(RPCS)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(message=malformed(RPCS[rpc]))
    def check(message: bytes) -> None:
        try:
            call(message, timeout=60)
        except grpc.RpcError as error:
            assert error.code() not in FAILURES, (error.code(), error.details(), message)

    check()
    answer = call(RPCS[rpc], timeout=30)
    assert answer is not None
    channel.close()


def test_the_servers_are_still_correct_after_the_fuzzing(servers: dict[str, Server]) -> None:
    from sentence_transformers import SentenceTransformer

    import rose

    texts = ["hello world", "the fuzzing is over"]
    expected = SentenceTransformer(str(rose.default_model_path()), device="cpu").encode(texts)
    answer = requests.post(f"{servers['embed'].url}/v1/embeddings", json={"input": texts}, timeout=60)
    got = np.array([d["embedding"] for d in answer.json()["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-4)
    scored = requests.post(f"{servers['score'].url}/rerank", json=VALID["/rerank"], timeout=60)
    assert scored.status_code == 200 and len(scored.json()) == 2
