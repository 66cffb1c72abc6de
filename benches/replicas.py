"""Replicas per device: one ivy-serve per replica count (`--devices D --replicas N`, N = 1, 2, 4),
all started at once and measured in alternating slices, on short queries alone and on a mixed load
of client batches and queries.

    python benches/replicas.py                                   # CPU: --devices cpu, MiniLM
    python benches/replicas.py --devices 0 --model DIR           # a GPU, any model folder

Queries: `--query-clients` clients, each sending one 4-16-token query at a time for a slice:
answered queries/s and their p50/p99. Mixed: two clients sending batches of 32 passages
(32-256 tokens) while the query clients keep going: batch tokens/s and the queries' p50/p99.
Each server's figures pool its slices over `--rounds` rounds; the ratios are against 1 replica.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from corpus import passages, queries  # noqa: E402
from support import Server, start_server  # noqa: E402


class Slice:
    """Clients posting to one server until the slice ends; what each answered and when."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url, self.end = url, time.monotonic() + seconds
        self.latencies: list[float] = []
        self.batch_tokens = 0
        self.errors = 0
        self.seconds = seconds
        self._lock = threading.Lock()

    def _post(self, session: requests.Session, texts: list[str]) -> tuple[float, int]:
        start = time.perf_counter()
        answer = session.post(f"{self.url}/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
        if answer.status_code != 200:
            with self._lock:
                self.errors += 1
            return time.perf_counter() - start, 0
        return time.perf_counter() - start, answer.json()["usage"]["prompt_tokens"]

    def querier(self, pool: list[str], seed: int) -> None:
        rng, session = random.Random(seed), requests.Session()
        while time.monotonic() < self.end:
            seconds, _ = self._post(session, [rng.choice(pool)])
            with self._lock:
                self.latencies.append(seconds)

    def batcher(self, pool: list[str], seed: int) -> None:
        rng, session = random.Random(seed), requests.Session()
        while time.monotonic() < self.end:
            _, tokens = self._post(session, rng.sample(pool, 32))
            with self._lock:
                self.batch_tokens += tokens


def run_slice(url: str, seconds: float, pools: tuple[list[str], list[str]], clients: int, mixed: bool) -> Slice:
    """One slice of `seconds`: `clients` query clients, and two batch clients when `mixed`."""
    query_pool, doc_pool = pools
    s = Slice(url, seconds)
    threads = [threading.Thread(target=s.querier, args=(query_pool, i)) for i in range(clients)]
    if mixed:
        threads += [threading.Thread(target=s.batcher, args=(doc_pool, 100 + i)) for i in range(2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.seconds = time.monotonic() - start
    return s


def summarize(slices: list[Slice]) -> dict[str, float]:
    latencies = np.array([x for s in slices for x in s.latencies]) * 1000
    seconds = sum(s.seconds for s in slices)
    return {
        "queries_per_s": len(latencies) / seconds,
        "query_p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        "query_p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        "batch_tokens_per_s": sum(s.batch_tokens for s in slices) / seconds,
        "errors": sum(s.errors for s in slices),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="cpu", help="ivy-serve --devices (cpu, or GPU indices)")
    p.add_argument("--model", help="a model folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--query-clients", type=int, default=8)
    p.add_argument("--slice", type=float, default=5.0, help="seconds of one slice")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-arg", action="append", default=[], help="a flag for every ivy-serve")
    p.add_argument("--out", type=Path, default=Path("benches/out/replicas.json"))
    args = p.parse_args()

    from tokenizers import Tokenizer

    import rose

    folder = Path(args.model) if args.model else rose.default_model_path()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def count(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    pools = (queries(400, 4, 16, count), passages(400, 32, 256, count))
    model = ["--model", str(folder)] if args.model else []
    logs = Path(args.out).parent / "replicas-logs"
    logs.mkdir(parents=True, exist_ok=True)
    servers: dict[int, Server] = {}
    try:
        for n in args.replicas:
            flags = [*model, "--devices", args.devices, "--replicas", str(n), *args.server_arg]
            servers[n] = start_server(logs, *flags, timeout=900)
        for server in servers.values():
            server.settle()
            run_slice(server.url, 2, pools, args.query_clients, mixed=True)  # warm-up
        slices: dict[tuple[int, str], list[Slice]] = {}
        for _ in range(args.rounds):
            for n, server in servers.items():
                for mixed in (False, True):
                    s = run_slice(server.url, args.slice, pools, args.query_clients, mixed)
                    slices.setdefault((n, "mixed" if mixed else "queries"), []).append(s)
    finally:
        for server in servers.values():
            server.stop()
    report = {f"{n} x {load}": summarize(s) for (n, load), s in slices.items()}
    base_q, base_m = report[f"{args.replicas[0]} x queries"], report[f"{args.replicas[0]} x mixed"]
    name = args.model or "all-MiniLM-L6-v2"
    print(f"devices {args.devices}, model {name}, {args.query_clients} query clients, {args.rounds} rounds")
    print("| replicas | queries/s | p50 ms | p99 ms | mixed: batch tokens/s | mixed: query p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.replicas:
        q, m = report[f"{n} x queries"], report[f"{n} x mixed"]
        qx = q["queries_per_s"] / base_q["queries_per_s"]
        mx = m["batch_tokens_per_s"] / base_m["batch_tokens_per_s"]
        print(
            f"| {n} | {q['queries_per_s']:.1f} ({qx:.2f}x) | {q['query_p50_ms']:.1f} | {q['query_p99_ms']:.1f} "
            f"| {m['batch_tokens_per_s']:.0f} ({mx:.2f}x) | {m['query_p50_ms']:.1f} | {m['query_p99_ms']:.1f} "
            f"| {q['errors'] + m['errors']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
