"""The one timing rule of the throughput benches (a warm-up run, then the best of a few), and
the one batch client of the HTTP benches."""

from __future__ import annotations

import statistics
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
    body = lambda chunk: {"input": chunk, "encoding_format": encoding_format}  # noqa: E731
    return post_batches(url, "/v1/embeddings", texts, batch, concurrency, body)


def post_batches(
    url: str, path: str, texts: list[str], batch: int, concurrency: int, body: Callable[[list[str]], dict]
) -> tuple[float, int]:
    """Seconds and tokens (TEI's x-compute-tokens) to post `texts` to `path` in client batches of
    `batch` (`body` makes a request of a batch), `concurrency` in flight."""
    session = requests.Session()

    def post(chunk: list[str]) -> int:
        response = session.post(f"{url}{path}", json=body(chunk), timeout=600)
        response.raise_for_status()
        return int(response.headers["x-compute-tokens"])

    return in_batches(post, texts, batch, concurrency)


def in_batches(embed: Callable[[list[str]], int], texts: list[str], batch: int, concurrency: int) -> tuple[float, int]:
    """Seconds and tokens to run `embed` (a batch of texts -> its tokens) over `texts` in batches
    of `batch`, `concurrency` at a time."""
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(embed, [texts[i : i + batch] for i in range(0, len(texts), batch)]))
    return time.perf_counter() - start, tokens


def alternate(
    slices: int, ours: Callable[[], tuple[float, int]], theirs: Callable[[], object], names: tuple[str, str]
) -> tuple[list[float], list[float], list[float]]:
    """The two sides in alternating slices (this VM's speed drifts within seconds, so only the
    ratio of neighbours means much), each run once before as a warm-up: our tokens/s (`ours`
    returns seconds and tokens), the peer's over the same tokens (`theirs` is timed here), and
    the ratios, slice by slice."""
    ours()
    theirs()
    _synchronize()
    rates, peers, ratios = [], [], []
    for s in range(slices):
        seconds, tokens = ours()
        start = time.perf_counter()
        theirs()
        _synchronize()
        rates.append(tokens / seconds)
        peers.append(tokens / (time.perf_counter() - start))
        ratios.append(rates[-1] / peers[-1])
        print(f"slice {s}: {names[0]} {rates[-1]:,.0f} tokens/s, {names[1]} {peers[-1]:,.0f}: {ratios[-1]:.2f}x",
              flush=True)  # fmt: skip
    return rates, peers, ratios


def report(rates: list[float], peers: list[float], ratios: list[float], names: tuple[str, str]) -> None:
    """The medians of `alternate`'s slices, and each slice's ratio."""
    print(f"{names[0]}: {statistics.median(rates):,.0f} tokens/s (median)")
    print(f"{names[1]}: {statistics.median(peers):,.0f} tokens/s (median)")
    print(f"ratio, median of {len(ratios)} slices: {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
