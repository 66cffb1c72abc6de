"""Replicas per device: one ivy-serve per replica count (`--devices D --replicas N`, N = 1, 2, 4),
all started at once and measured in alternating slices, on short queries alone and on a mixed load
of client batches and queries.

    python benches/replicas.py                                   # CPU: --devices cpu, MiniLM
    python benches/replicas.py --devices 0 --model DIR           # a GPU, any model folder
    python benches/replicas.py --devices 0 --kill 2              # a worker of 2 SIGKILLed under load

Queries: `--query-clients` clients, each sending one 4-16-token query at a time for a slice:
answered queries/s and their p50/p99. Mixed: two clients sending batches of 32 passages
(32-256 tokens) while the query clients keep going: batch tokens/s and the queries' p50/p99.
Each server's figures pool its slices over `--rounds` rounds; the ratios are against 1 replica.
With `--kill N`: one server of N replicas under the mixed load, one worker SIGKILLed: requests
failed, p99 while it was down, how long the supervisor took to serve with it again, and the
restarted worker's start-up fidelity check.
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
        self.sent: list[float] = []
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
            sent = time.monotonic()
            seconds, _ = self._post(session, [rng.choice(pool)])
            with self._lock:
                self.latencies.append(seconds)
                self.sent.append(sent)

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


def workers(server: Server) -> dict[int, int]:
    """The server's worker processes: pid -> gRPC port."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if (
                not entry.name.isdigit()
                or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != server.process.pid
            ):
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            found[int(entry.name)] = int(argv[argv.index(b"--grpc-port") + 1])
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_one(server: Server, pools: tuple[list[str], list[str]], clients: int, seconds: float) -> None:
    """The mixed load on `server` for `seconds`; a worker SIGKILLed a quarter of the way in."""
    import os
    import signal

    load = Slice(server.url, seconds)
    threads = [threading.Thread(target=load.querier, args=(pools[0], i)) for i in range(clients)]
    threads += [threading.Thread(target=load.batcher, args=(pools[1], 100 + i)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(seconds / 4)
    pid, port = next(iter(workers(server).items()))
    url = f"http://127.0.0.1:{port}"
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def state() -> str:
        replicas = requests.get(f"{server.url}/info", timeout=10).json()["replicas"]
        return next(r["state"] for r in replicas if r["url"] == url)

    while state() == "ready":
        time.sleep(0.05)
    while state() != "ready":
        time.sleep(0.1)
    back = time.monotonic()
    for t in threads:
        t.join()
    window = [x for x, sent in zip(load.latencies, load.sent, strict=True) if killed <= sent <= back]
    replicas = requests.get(f"{server.url}/info", timeout=30).json()["replicas"]
    fidelity = next(r["engine"]["fidelity"] for r in replicas if r["url"] == url)
    print(f"queries answered: {len(load.latencies)}, batch tokens: {load.batch_tokens}, failed: {load.errors}")
    print(
        f"query p99 while the worker was down: {np.percentile(window, 99) * 1000:.1f} ms ({len(window)} queries); "
        f"overall {np.percentile(load.latencies, 99) * 1000:.1f} ms"
    )
    print(f"worker serving again {back - killed:.1f} s after SIGKILL; its fidelity check: {json.dumps(fidelity)}")


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
    p.add_argument("--kill", type=int, metavar="N", help="kill a worker of an N-replica server under load instead")
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
    if args.kill:
        flags = [*model, "--devices", args.devices, "--replicas", str(args.kill), *args.server_arg]
        server = start_server(logs, *flags, timeout=900)
        try:
            server.settle()
            kill_one(server, pools, args.query_clients, max(40.0, args.slice * 8))
        finally:
            server.stop()
        return
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
