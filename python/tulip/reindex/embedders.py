"""The two ways ivy-embed embeds: in this process (Tulip and ROSE loaded here, Ivy's request path
without HTTP) or against a running server's OpenAI route, with vectors in the output's dtype."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np
import requests

from tulip import Client, Overloaded

T = TypeVar("T")

BUSY_PATIENCE = 600.0
"""Seconds a batch is offered again while the engine turns it away (429: its queue is full)
before the run stops: a batch job waits for room rather than failing on a busy server."""

# The output dtype -> the encoding asked of the engine (float16 is made from float32 here).
_ENCODINGS = {"float32": "float32", "float16": "float32", "int8": "int8", "binary": "binary"}
_NUMPY = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}


class Embedder(Protocol):
    """Embeds a batch of texts: (vectors in the output dtype, tokens embedded)."""

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]: ...


def _as_output(array: np.ndarray, dtype: str) -> np.ndarray:
    return array.astype(np.float16) if dtype == "float16" else array


def until_accepted(attempt: Callable[[], T | None], what: str, patience: float = BUSY_PATIENCE) -> T:
    """`attempt()`'s value, tried again (waiting longer each time, up to 2 s) while it returns
    None: the engine was busy."""
    wait, deadline = 0.05, time.monotonic() + patience
    while (result := attempt()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} turned a batch away for {patience:.0f} s: too busy for a batch job")
        time.sleep(wait)
        wait = min(wait * 2, 2.0)
    return result


class InProcess:
    """Tulip and ROSE in this process (`tulip.Client.in_process`)."""

    def __init__(self, client: Client, dtype: str, prompt_name: str | None, dimensions: int | None) -> None:
        self.client, self.dtype = client, dtype
        self.options = {"prompt_name": prompt_name, "dimensions": dimensions, "encoding": _ENCODINGS[dtype]}

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        def attempt() -> tuple | None:
            try:
                return self.client.embed_raw(texts, **self.options)
            except Overloaded:
                return None

        data, rows, _, tokens = until_accepted(attempt, "the engine")
        array = np.frombuffer(data, dtype=_NUMPY[self.options["encoding"]]).reshape(rows, -1)
        return _as_output(array, self.dtype), tokens


class OverHttp:
    """A running server's `/v1/embeddings`: raw bytes for floats (vLLM's `bytes_only`, the token
    count in TEI's x-compute-tokens header), int8 and binary as JSON."""

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
        # Not `bytes`: its metadata header grows with the batch, past the 64 KiB header line that
        # Python's http.client reads at about 1,000 documents, and costs a JSON parse a batch.
        raw = _ENCODINGS[self.dtype] == "float32"
        body: dict = {"input": texts, "encoding_format": "bytes_only" if raw else self.dtype}
        if self.dimensions:
            body["dimensions"] = self.dimensions

        def attempt() -> requests.Response | None:
            response = self.session.post(self.url, json=body, timeout=600)
            return None if response.status_code == 429 else response

        response = until_accepted(attempt, self.url)
        if response.status_code != 200:
            raise RuntimeError(f"{self.url} answered {response.status_code}: {response.text[:500]}")
        if raw:
            array = np.frombuffer(response.content, dtype="<f4").reshape(len(texts), -1)
            return _as_output(array, self.dtype), int(response.headers["x-compute-tokens"])
        answer = response.json()
        rows = [item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])]
        return np.array(rows, dtype=_NUMPY[self.dtype]), int(answer["usage"]["prompt_tokens"])
