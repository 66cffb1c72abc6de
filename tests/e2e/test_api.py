"""The API's description and the conveniences around the routes: /openapi.json and /docs, Cohere's
/v2/embed through the Cohere SDK, vLLM's raw-bytes encodings, the timing metrics, --help's groups."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import requests
from openapi_spec_validator import validate

from support import Server, cosines

# What users of TEI, OpenAI, Cohere and vLLM call, and the status routes.
ROUTES = {
    "/v1/embeddings": "post",
    "/v1/models": "get",
    "/v2/embed": "post",
    "/embed": "post",
    "/embed_sparse": "post",
    "/tokenize": "post",
    "/decode": "post",
    "/similarity": "post",
    "/predict": "post",
    "/rerank": "post",
    "/v1/rerank": "post",
    "/v2/rerank": "post",
    "/health": "get",
    "/live": "get",
    "/info": "get",
    "/metrics": "get",
}


def post(server: Server, route: str, body: object) -> requests.Response:
    return requests.post(f"{server.url}{route}", json=body, timeout=120)


def tei_vectors(server: Server, texts: list[str]) -> np.ndarray:
    response = post(server, "/embed", {"inputs": texts})
    assert response.status_code == 200, response.text
    return np.array(response.json(), dtype=np.float32)


def test_the_openapi_spec_is_valid_and_describes_every_route(server: Server) -> None:
    spec = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    validate(spec)
    described = {path: set(ops) for path, ops in spec["paths"].items()}
    for route, method in ROUTES.items():
        assert method in described.get(route, set()), f"{method.upper()} {route} is not in /openapi.json"
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "200" in operation["responses"], f"{method} {path} documents no answer"
            # Every described route is served (an empty body is a 4xx, never a 404 or 405).
            status = requests.request(method, f"{server.url}{path}", json={}, timeout=30).status_code
            assert status not in (404, 405), f"{method.upper()} {path} is described but answers {status}"
    request = spec["components"]["schemas"]["EmbeddingsRequest"]
    assert {"input", "encoding_format", "dimensions", "embed_dtype"} <= set(request["properties"])


def test_the_docs_page_is_served_from_the_binary(server: Server) -> None:
    page = requests.get(f"{server.url}/docs/", timeout=30)
    assert page.status_code == 200 and "swagger-ui" in page.text and "/openapi.json" in page.text
    # Its script comes from this server, not a CDN.
    assert "https://" not in page.text.split("<body")[0]
    script = requests.get(f"{server.url}/docs/swagger-ui-bundle.js", timeout=30)
    assert script.status_code == 200 and len(script.content) > 100_000


def test_cohere_sdk_embeds_through_v2_embed(server: Server, texts: list[str], reference: np.ndarray) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    some = texts[:24]
    response = client.embed(
        texts=some,
        model="m",
        input_type="search_document",
        embedding_types=["float", "int8", "uint8", "binary", "ubinary"],
    )
    floats = np.array(response.embeddings.float_, dtype=np.float32)
    assert cosines(floats, reference[:24]).min() >= 0.9999
    int8 = np.array(response.embeddings.int8)
    assert int8.shape == (24, 384) and int8.min() >= -128 and int8.max() <= 127
    np.testing.assert_array_equal(np.array(response.embeddings.uint8), int8 + 128)
    ubinary = np.array(response.embeddings.ubinary)
    assert ubinary.shape == (24, 48)
    np.testing.assert_array_equal(ubinary, np.packbits(floats > 0, axis=1))
    np.testing.assert_array_equal(np.array(response.embeddings.binary), ubinary - 128)
    assert response.texts == some and response.meta.billed_units.input_tokens > 24


def test_cohere_embed_refuses_what_it_does_not_serve(server: Server) -> None:
    for body, field in [
        ({"texts": ["a"], "embedding_types": ["float64"]}, "embedding_types"),
        ({"texts": ["a"], "input_type": "music"}, "input_type"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
        ({"texts": []}, "texts"),
        ({"images": ["data:image/png;base64,AAAA"]}, "images"),
    ]:
        response = post(server, "/v2/embed", body)
        assert 400 <= response.status_code < 500 and field in response.json()["error"], (body, response.text)


def test_vllm_bytes_encoding_carries_the_vectors_and_their_offsets(server: Server) -> None:
    texts = ["raw bytes", "for clients that read them", "x"]
    expected = tei_vectors(server, texts)
    for dtype, numpy_dtype in [("float32", "<f4"), ("float16", "<f2")]:
        response = post(server, "/v1/embeddings", {"input": texts, "encoding_format": "bytes", "embed_dtype": dtype})
        assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
        metadata = json.loads(response.headers["metadata"])
        assert metadata["usage"]["prompt_tokens"] > 3
        for item, want in zip(metadata["data"], expected, strict=True):
            got = np.frombuffer(response.content[item["start"] : item["end"]], dtype=numpy_dtype)
            assert item["shape"] == [384] and item["embed_dtype"] == dtype
            np.testing.assert_allclose(got.astype(np.float32), want, atol=1e-3 if dtype == "float16" else 1e-6)
    big = post(server, "/v1/embeddings", {"input": "x", "encoding_format": "bytes_only", "endianness": "big"})
    assert "metadata" not in big.headers
    np.testing.assert_allclose(np.frombuffer(big.content, dtype=">f4"), expected[2], atol=1e-6)
    bad = post(server, "/v1/embeddings", {"input": "x", "encoding_format": "bytes", "embed_dtype": "fp4"})
    assert bad.status_code == 422 and "embed_dtype" in bad.json()["error"]


def test_metrics_hold_the_timing_headers_numbers(server: Server) -> None:
    post(server, "/embed", {"inputs": ["count me"]}).raise_for_status()
    metrics = requests.get(f"{server.url}/metrics", timeout=30).text
    for name in ("total", "compute", "tokenization", "queue", "inference"):
        assert f'ivy_{name}_duration_seconds_count{{route="tei"}}' in metrics, name
    assert "ivy_input_characters_total" in metrics


def test_help_groups_the_flags_and_version_answers() -> None:
    out = subprocess.run(["ivy-serve", "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    headings = [line.rstrip(":") for line in out.splitlines() if line and not line.startswith(" ")]
    for group in ("Model", "Serving", "Scaling", "Limits", "Observability"):
        assert group in headings, headings
    model = out.split("\nModel:")[1].split("\nServing:")[0]
    assert "--model" in model and "--revision" in model and "--port" not in model
    version = subprocess.run(["ivy-serve", "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert version.stdout.startswith("ivy-serve 0.")


def test_every_answer_carries_a_request_id(server: Server) -> None:
    import uuid

    made = post(server, "/embed", {"inputs": ["id me"]}).headers["x-request-id"]
    assert uuid.UUID(made).version == 4
    mine = requests.post(f"{server.url}/embed", json={"inputs": []}, headers={"x-request-id": "client-7"}, timeout=30)
    assert mine.status_code == 422 and mine.headers["x-request-id"] == "client-7"
    missing = requests.get(f"{server.url}/no/such/route", timeout=30)
    assert missing.status_code == 404 and missing.headers["x-request-id"] != made
