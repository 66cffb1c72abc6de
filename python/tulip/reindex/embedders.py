"""The two ways ivy-embed embeds: in this process (Tulip and ROSE loaded here, Ivy's request path
without HTTP) or against a running server's OpenAI route, with vectors in the output's dtype."""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np
import requests

from tulip import Client

# The output dtype -> the encoding asked of the engine (float16 is made from float32 here).
_ENCODINGS = {"float32": "float32", "float16": "float32", "int8": "int8", "binary": "binary"}
_NUMPY = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}


class Embedder(Protocol):
    """Embeds a batch of texts: (vectors in the output dtype, tokens embedded)."""

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]: ...


def _as_output(array: np.ndarray, dtype: str) -> np.ndarray:
    return array.astype(np.float16) if dtype == "float16" else array


class InProcess:
    """Tulip and ROSE in this process (`tulip.Client.in_process`)."""

    def __init__(self, client: Client, dtype: str, prompt_name: str | None, dimensions: int | None) -> None:
        self.client, self.dtype = client, dtype
        self.options = {"prompt_name": prompt_name, "dimensions": dimensions, "encoding": _ENCODINGS[dtype]}

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        data, rows, _, tokens = self.client.embed_raw(texts, **self.options)
        array = np.frombuffer(data, dtype=_NUMPY[self.options["encoding"]]).reshape(rows, -1)
        return _as_output(array, self.dtype), tokens


class OverHttp:
    """A running server's `/v1/embeddings`: vLLM's raw bytes for floats, int8 and binary as JSON."""

    def __init__(
        self, url: str, dtype: str, prompt_name: str | None, dimensions: int | None, api_key: str | None = None
    ) -> None:
        if prompt_name:
            raise ValueError("--prompt-name is served by the in-process path and TEI's /embed, not with --server")
        self.url, self.dtype, self.dimensions = url.rstrip("/") + "/v1/embeddings", dtype, dimensions
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        body: dict = {"input": texts, "encoding_format": "bytes" if _ENCODINGS[self.dtype] == "float32" else self.dtype}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        response = self.session.post(self.url, json=body, timeout=600)
        if response.status_code != 200:
            raise RuntimeError(f"{self.url} answered {response.status_code}: {response.text[:500]}")
        if body["encoding_format"] == "bytes":
            metadata = json.loads(response.headers["metadata"])
            array = np.frombuffer(response.content, dtype="<f4").reshape(len(texts), -1)
            return _as_output(array, self.dtype), int(metadata["usage"]["prompt_tokens"])
        answer = response.json()
        rows = [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
        return np.array(rows, dtype=_NUMPY[self.dtype]), int(answer["usage"]["prompt_tokens"])
