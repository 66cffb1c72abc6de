"""The one timing rule of the throughput benches (a warm-up run, then the best of a few), and
the one batch client of the HTTP benches."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import requests
import torch


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` runs of `fn`, after one untimed run (JIT, allocator,
    lazy graph capture); the GPU's queued work is waited for on both sides of each run."""
    fn()
    _synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def http_batches(
    url: str, texts: list[str], batch: int, concurrency: int, encoding_format: str = "bytes"
) -> tuple[float, int]:
    """Seconds and tokens to embed `texts` over `/v1/embeddings` in client batches of `batch`,
    `concurrency` in flight; `encoding_format` bytes (vLLM's raw vectors) or base64."""
    session = requests.Session()

    def post(chunk: list[str]) -> int:
        body = {"input": chunk, "encoding_format": encoding_format}
        response = session.post(f"{url}/v1/embeddings", json=body, timeout=600)
        response.raise_for_status()
        if encoding_format == "bytes":
            return json.loads(response.headers["metadata"])["usage"]["prompt_tokens"]
        return response.json()["usage"]["prompt_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(post, [texts[i : i + batch] for i in range(0, len(texts), batch)]))
    return time.perf_counter() - start, tokens
