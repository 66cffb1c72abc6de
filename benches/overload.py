"""Overload: a real ivy-serve sent ten times the rate it sustains, for a minute, with mixed
requests (queries, and client batches of 32 documents); every answer must be a 200 or a 429 (none
of 5xx, none later than the server's deadline), the admitted requests' p99 bounded, and the
server's resident memory flat.

    python benches/overload.py                    # CPU, all-MiniLM-L6-v2
    python benches/overload.py --device cuda --times 10 --seconds 60

The sustainable rate is measured first: the same mix, closed loop, for --probe-seconds. The
overload then sends requests open loop at --times that rate from a pool of threads; a request
that cannot be sent on time is sent late, never skipped. Prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from soak import sample  # noqa: E402

from corpus import documents, queries  # noqa: E402
from support import start_server  # noqa: E402


def bodies(count: int, batch_share: float, seed: int = 0) -> list[dict]:
    """Request bodies: a query each, or a batch of 32 documents with probability batch_share."""
    words_to_tokens = lambda text: len(text.split()) * 4 // 3  # noqa: E731
    docs = documents(1000, 32, 200, words_to_tokens)
    qs = queries(1000, 5, 30, words_to_tokens)
    rng = random.Random(seed)
    return [{"input": rng.sample(docs, 32)} if rng.random() < batch_share else {"input": rng.choice(qs)}
            for _ in range(count)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model")
    parser.add_argument("--times", type=float, default=10, help="the overload, in multiples of the sustained rate")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--probe-seconds", type=float, default=15)
    parser.add_argument("--batch-share", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--request-timeout", type=float, default=10, help="the server's --request-timeout")
    parser.add_argument("--out", type=Path, default=Path("/tmp/overload"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    flags = ["--device", args.device, "--auto-truncate", "--request-timeout", str(args.request_timeout)]
    server = start_server(args.out, *flags, *(["--model", args.model] if args.model else []), timeout=600)
    work = bodies(20000, args.batch_share)
    local = threading.local()

    def send(body: dict) -> tuple[int, float]:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        began = time.perf_counter()
        try:
            status = session.post(
                f"{server.url}/v1/embeddings", json=body, timeout=args.request_timeout + 30
            ).status_code
        except requests.RequestException:
            status = -1
        return status, time.perf_counter() - began

    try:
        # The sustained rate: the mix, closed loop, as many in flight as the server admits well.
        done, began = 0, time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            while time.perf_counter() - began < args.probe_seconds:
                done += sum(1 for status, _ in pool.map(send, work[done : done + 64]) if status == 200)
        sustained = done / (time.perf_counter() - began)
        rate = sustained * args.times
        start = sample(server, args.device)
        results: list[tuple[int, float]] = []
        lock = threading.Lock()

        def fire(body: dict) -> None:
            answer = send(body)
            with lock:
                results.append(answer)

        began = time.perf_counter()
        count = int(rate * args.seconds)
        with ThreadPoolExecutor(args.threads) as pool:
            for i in range(count):
                time.sleep(max(0.0, began + i / rate - time.perf_counter()))
                pool.submit(fire, work[i % len(work)])
        end = sample(server, args.device)
        alive = server.process.poll() is None
    finally:
        server.stop()
    statuses = Counter(status for status, _ in results)
    admitted = np.array([t for status, t in results if status == 200]) * 1000
    refused = np.array([t for status, t in results if status == 429]) * 1000
    figures = {
        "sustained_requests_per_s": round(sustained, 1),
        "sent_requests_per_s": round(rate, 1),
        "seconds": args.seconds,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "only_200_and_429": set(statuses) <= {200, 429},
        "admitted_ms": {f"p{p}": round(float(np.percentile(admitted, p)), 1) for p in (50, 99)}
        if len(admitted)
        else None,
        "refused_ms_p99": round(float(np.percentile(refused, 99)), 1) if len(refused) else None,
        "slowest_s": round(max(t for _, t in results), 2),
        "rss_mib": [start["rss_mib"], end["rss_mib"]],
        "open_fds": [start["open_fds"], end["open_fds"]],
        "server_alive": alive,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
