"""Admission by work: large requests share --max-queued-tokens (past it, 429 with Retry-After at
once), while small requests (queries) have a budget of their own and are still served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from support import pair_ids, save_cross_encoder, start_server


def test_large_requests_past_the_token_budget_get_429_and_queries_do_not(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--max-queued-tokens", "3000")
    try:
        assert requests.get(f"{server.url}/info", timeout=10).json()["max_queued_tokens"] == 3000
        passage = "a passage long enough to count, about admission by tokens rather than requests " * 12
        large = {"inputs": [passage] * 10, "truncate": True}  # ~2,000 tokens

        def post_large(_: int) -> tuple[int, float, str | None]:
            began = time.monotonic()
            answer = requests.post(f"{server.url}/embed", json=large, timeout=120)
            return answer.status_code, time.monotonic() - began, answer.headers.get("retry-after")

        with ThreadPoolExecutor(8) as pool:
            flood = [pool.submit(post_large, i) for i in range(8)]
            time.sleep(0.2)
            query = requests.post(f"{server.url}/embed", json={"inputs": "a short query"}, timeout=120)
            results = [f.result() for f in flood]
        assert query.status_code == 200, query.text
        codes = [code for code, _, _ in results]
        assert set(codes) == {200, 429}, codes
        for code, seconds, retry_after in results:
            if code == 429:
                assert retry_after == "1" and seconds < 2
        # Once the flood is answered, the budget is free again.
        assert requests.post(f"{server.url}/embed", json=large, timeout=120).status_code == 200
    finally:
        server.stop()


def test_a_request_over_the_token_limit_is_refused_413_at_once(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--max-request-tokens", "50")
    try:
        assert requests.get(f"{server.url}/info", timeout=10).json()["max_request_tokens"] == 50
        long = {"input": [" ".join(["word"] * 20)] * 3}  # 66 tokens with the special ones
        answer = requests.post(f"{server.url}/v1/embeddings", json=long, timeout=60)
        assert answer.status_code == 413, answer.text
        assert "--max-request-tokens" in answer.json()["error"] and "66 tokens" in answer.json()["error"]
        short = {"input": [" ".join(["word"] * 20)] * 2}
        assert requests.post(f"{server.url}/v1/embeddings", json=short, timeout=60).status_code == 200
    finally:
        server.stop()


def test_large_requests_that_would_wait_past_half_the_deadline_get_429_not_504(tmp_path: Path) -> None:
    # A budget too large for this CPU to drain within the deadline: the measured drain rate refuses.
    server = start_server(tmp_path, "--request-timeout", "4", "--max-queued-tokens", "1000000")
    try:
        passage = "a passage long enough to count, about admission by tokens rather than requests " * 12
        large = {"inputs": [passage] * 10, "truncate": True}  # ~2,000 tokens

        def post_large(_: int) -> tuple[int, str, str | None]:
            answer = requests.post(f"{server.url}/embed", json=large, timeout=120)
            return answer.status_code, answer.text, answer.headers.get("retry-after")

        # The drain rate is measured once large requests have kept the queue busy for a while
        # (until then only --max-queued-tokens bounds them): two at a time, within the deadline.
        with ThreadPoolExecutor(2) as pool:
            assert {code for code, _, _ in pool.map(post_large, range(8))} <= {200, 429}
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(post_large, range(160)))
        codes = [code for code, _, _ in results]
        assert 504 not in codes and set(codes) == {200, 429}, sorted(set(codes))
        refused = [(text, retry_after) for code, text, retry_after in results if code == 429]
        assert all("to drain" in text and int(retry_after) >= 1 for text, retry_after in refused), refused[0]
    finally:
        server.stop()


def test_a_rerank_larger_than_the_queue_budget_runs_and_its_total_is_limited(tmp_path: Path) -> None:
    """A rerank's pairs go to the engine in groups of about 16,384 tokens as they are tokenized;
    the request is admitted once, so its later groups wait for the queue (here smaller than one
    group) instead of being refused, and --max-request-tokens bounds the whole request."""
    folder = save_cross_encoder(tmp_path / "ms-marco-tiny")
    query = "which passage is about admission?"
    docs = [f"passage {i} about admission by tokens rather than requests, " * 20 for i in range(300)]
    total = sum(len(pair_ids(folder, query, d)[0]) for d in docs)
    assert total > 3 * 16384, total  # several groups
    server = start_server(tmp_path, "--model", str(folder), "--max-queued-tokens", "10000",
                          "--max-client-batch-size", "400", "--max-request-tokens", str(total + 10))  # fmt: skip
    try:
        answer = requests.post(f"{server.url}/rerank", json={"query": query, "texts": docs}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert sorted(r["index"] for r in answer.json()) == list(range(len(docs)))
        more = docs + docs[:1]
        refused = requests.post(f"{server.url}/rerank", json={"query": query, "texts": more}, timeout=120)
        assert refused.status_code == 413, refused.text
        assert "--max-request-tokens" in refused.json()["error"]
        assert requests.post(f"{server.url}/rerank", json={"query": query, "texts": docs}, timeout=120).ok
    finally:
        server.stop()
