"""Replicas per device: one ivy-serve per replica count (`--devices D --replicas N`, N = 1, 2, 4),
all started at once and measured in alternating slices: short queries at saturation, short queries
at a steady rate, and that steady rate beside a load of client batches.

    python benches/replicas.py                                   # CPU: --devices cpu, MiniLM
    python benches/replicas.py --devices 0 --model DIR           # a GPU, any model folder
    python benches/replicas.py --devices 0 --kill 2              # a worker of 2 SIGKILLed under load

Queries: `--client-processes` x `--query-clients` clients (threads), each sending one
4-16-token query at a time: answered queries/s and their p50/p99. Steady: the same clients
sending `--rate` queries/s in all on a fixed schedule, each latency counted from its scheduled
send (so a slow answer delays no measurement). Mixed: the steady queries while two clients send
batches of 32 passages (32-256 tokens): batch tokens/s and the queries' p50/p99. Each server's
figures pool its slices over `--rounds` rounds; the ratios are against 1 replica.
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
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from corpus import passages, queries  # noqa: E402
from support import Server, start_server  # noqa: E402


@dataclass
class Answers:
    """What some clients got: each query's latency and (scheduled) send time, batch tokens, errors."""

    latencies: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    batch_tokens: int = 0
    errors: int = 0

    def add(self, other: Answers) -> None:
        self.latencies += other.latencies
        self.sent += other.sent
        self.batch_tokens += other.batch_tokens
        self.errors += other.errors


def _post(session: requests.Session, url: str, texts: list[str]) -> int | None:
    """The tokens embedded, None on an error answer."""
    answer = session.post(f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    return answer.json()["usage"]["prompt_tokens"] if answer.status_code == 200 else None


def query_clients(url: str, end: float, pool: list[str], clients: int, rate: float | None, seed: int) -> Answers:
    """`clients` threads sending one query at a time until `end` (time.time()), as fast as
    answered or, with `rate`, at `rate` queries/s in all on a fixed schedule."""
    answers, lock = Answers(), threading.Lock()

    def client(k: int) -> None:
        rng, session = random.Random(seed * 1000 + k), requests.Session()
        interval = clients / rate if rate else 0.0
        due = time.time() + rng.random() * interval
        while due < end:
            if rate:
                time.sleep(max(0.0, due - time.time()))
            sent = due if rate else time.time()
            tokens = _post(session, url, [rng.choice(pool)])
            with lock:
                answers.latencies.append(time.time() - sent)
                answers.sent.append(sent)
                answers.errors += tokens is None
            due = due + interval if rate else time.time()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def batch_client(url: str, end: float, pool: list[str], seed: int, answers: Answers, lock: threading.Lock) -> None:
    rng, session = random.Random(seed), requests.Session()
    while time.time() < end:
        tokens = _post(session, url, rng.sample(pool, 32))
        with lock:
            answers.batch_tokens += tokens or 0
            answers.errors += tokens is None


@dataclass
class Load:
    """The clients of a run: query client processes (threads each) and their steady rate."""

    processes: ProcessPoolExecutor
    count: int
    clients: int
    rate: float
    pools: tuple[list[str], list[str]]

    def run(
        self, url: str, seconds: float, kind: str, during: Callable[[], None] | None = None
    ) -> tuple[Answers, float]:
        """One slice of `kind` (queries, steady or mixed) on `url`; `during()` runs meanwhile in
        this process (the kill test). The answers and the slice's seconds."""
        start = time.time()
        end = start + seconds
        rate = None if kind == "queries" else self.rate / self.count
        futures = [
            self.processes.submit(query_clients, url, end, self.pools[0], self.clients, rate, k)
            for k in range(self.count)
        ]
        answers, lock = Answers(), threading.Lock()
        batchers = []
        if kind == "mixed":
            batchers = [
                threading.Thread(target=batch_client, args=(url, end, self.pools[1], 100 + i, answers, lock))
                for i in range(2)
            ]
        for t in batchers:
            t.start()
        if during is not None:
            during()
        for t in batchers:
            t.join()
        for f in futures:
            answers.add(f.result())
        return answers, time.time() - start


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


def kill_one(server: Server, load: Load, seconds: float) -> None:
    """The mixed load on `server` for `seconds`; a worker SIGKILLed a quarter of the way in."""
    import os
    import signal

    pid, port = next(iter(workers(server).items()))
    url = f"http://127.0.0.1:{port}"
    marks: dict[str, float] = {}

    def state() -> str:
        replicas = requests.get(f"{server.url}/info", timeout=10).json()["replicas"]
        return next(r["state"] for r in replicas if r["url"] == url)

    def kill() -> None:
        time.sleep(seconds / 4)
        marks["killed"] = time.time()
        os.kill(pid, signal.SIGKILL)
        while state() == "ready":
            time.sleep(0.05)
        while state() != "ready":
            time.sleep(0.1)
        marks["back"] = time.time()

    answers, _ = load.run(server.url, seconds, "mixed", during=kill)
    killed, back = marks["killed"], marks["back"]
    window = [x for x, sent in zip(answers.latencies, answers.sent, strict=True) if killed <= sent <= back]
    replicas = requests.get(f"{server.url}/info", timeout=30).json()["replicas"]
    fidelity = next(r["engine"]["fidelity"] for r in replicas if r["url"] == url)
    print(f"queries answered: {len(answers.latencies)}, batch tokens: {answers.batch_tokens}, failed: {answers.errors}")
    print(
        f"query p99 while the worker was down: {np.percentile(window, 99) * 1000:.1f} ms ({len(window)} queries); "
        f"overall {np.percentile(answers.latencies, 99) * 1000:.1f} ms"
    )
    print(f"worker serving again {back - killed:.1f} s after SIGKILL; its fidelity check: {json.dumps(fidelity)}")


def summarize(slices: list[tuple[Answers, float]]) -> dict[str, float]:
    latencies = np.array([x for a, _ in slices for x in a.latencies]) * 1000
    seconds = sum(s for _, s in slices)
    return {
        "queries_per_s": len(latencies) / seconds,
        "query_p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        "query_p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        "batch_tokens_per_s": sum(a.batch_tokens for a, _ in slices) / seconds,
        "errors": sum(a.errors for a, _ in slices),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", default="cpu", help="ivy-serve --devices (cpu, or GPU indices)")
    p.add_argument("--model", help="a model folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--client-processes", type=int, default=1, help="processes of query clients")
    p.add_argument("--query-clients", type=int, default=8, help="query clients (threads) a process")
    # Each client sends one query at a time: keep the rate under clients / latency, or the
    # schedule falls behind and the latencies measure that backlog.
    p.add_argument("--rate", type=float, default=5.0, help="queries/s of the steady and mixed loads")
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
    processes = ProcessPoolExecutor(args.client_processes)
    load = Load(processes, args.client_processes, args.query_clients, args.rate, pools)
    if args.kill:
        flags = [*model, "--devices", args.devices, "--replicas", str(args.kill), *args.server_arg]
        server = start_server(logs, *flags, timeout=900)
        try:
            server.settle()
            kill_one(server, load, max(40.0, args.slice * 8))
        finally:
            server.stop()
            processes.shutdown()
        return
    servers: dict[int, Server] = {}
    kinds = ("queries", "steady", "mixed")
    slices: dict[tuple[int, str], list[tuple[Answers, float]]] = {}
    try:
        for n in args.replicas:
            flags = [*model, "--devices", args.devices, "--replicas", str(n), *args.server_arg]
            servers[n] = start_server(logs, *flags, timeout=900)
        for server in servers.values():
            server.settle()
            load.run(server.url, 2, "mixed")  # warm-up
            load.run(server.url, 2, "queries")
        for _ in range(args.rounds):
            for n, server in servers.items():
                for kind in kinds:
                    slices.setdefault((n, kind), []).append(load.run(server.url, args.slice, kind))
    finally:
        for server in servers.values():
            server.stop()
        processes.shutdown()
    report = {f"{n} x {kind}": summarize(s) for (n, kind), s in slices.items()}
    base = {kind: report[f"{args.replicas[0]} x {kind}"] for kind in kinds}
    name = args.model or "all-MiniLM-L6-v2"
    clients = args.client_processes * args.query_clients
    print(f"devices {args.devices}, model {name}, {clients} query clients, steady {args.rate:g} queries/s, "
          f"{args.rounds} rounds of {args.slice:g} s slices")  # fmt: skip
    columns = ("replicas", "queries/s", "p50 / p99 ms", "steady: p50 / p99 ms", "mixed: batch tokens/s",
               "mixed: query p50 / p99 ms", "errors")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|---|")
    for n in args.replicas:
        q, s, m = (report[f"{n} x {kind}"] for kind in kinds)
        qx = q["queries_per_s"] / base["queries"]["queries_per_s"]
        mx = m["batch_tokens_per_s"] / base["mixed"]["batch_tokens_per_s"]
        print(
            f"| {n} | {q['queries_per_s']:,.0f} ({qx:.2f}x) | {q['query_p50_ms']:.2f} / {q['query_p99_ms']:.2f} "
            f"| {s['query_p50_ms']:.2f} / {s['query_p99_ms']:.2f} "
            f"| {m['batch_tokens_per_s']:,.0f} ({mx:.2f}x) | {m['query_p50_ms']:.2f} / {m['query_p99_ms']:.2f} "
            f"| {q['errors'] + s['errors'] + m['errors']} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
