"""Where one rerank request's time goes (GPU only): 1 query x N documents over `/rerank` at a steady
rate against an ivy-serve whose engine logs each step (benches/trace/sitecustomize.py). Prints, per
request and relative to the client's send: each step's host enqueue span and token count, its GPU
span, the waiter's return, the answer's arrival; then the medians.

    python3 benches/rerank_timeline.py --shape bge-reranker-base --docs 100 [--server-arg=...]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

here = Path(__file__).resolve().parent
sys.path[:0] = [str(here.parent / "tests"), str(here)]
from rerank import SHAPES, workload  # noqa: E402

from support import start_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="bge-reranker-base")
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=45, help="requests/s")
    parser.add_argument("--show", type=int, default=2, help="requests printed in full")
    parser.add_argument("--client", choices=["requests", "http.client"], default="requests")
    parser.add_argument("--server-arg", action="append", default=[], help="extra ivy-serve flag (repeatable)")
    args = parser.parse_args()

    folder, query, docs = workload(args.shape, args.docs)
    trace = Path(tempfile.mkdtemp()) / "trace.jsonl"
    env = {"ROSE_TRACE": str(trace), "PYTHONPATH": f"{here / 'trace'}:{os.environ.get('PYTHONPATH', '')}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # start_server passes the environment on
    task = ["--task", "score"] if SHAPES[args.shape][0] == "qwen3" else []
    try:
        server = start_server(Path(tempfile.mkdtemp()), "--model", str(folder), "--device", "cuda", *task,
                              *args.server_arg)  # fmt: skip
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    body = json.dumps({"query": query, "texts": docs, "truncate": True}).encode()
    headers = {"content-type": "application/json"}
    session = requests.Session()
    host, port = server.url.split("//")[1].split(":")
    connection = http.client.HTTPConnection(host, int(port))

    def post() -> dict[str, float]:
        if args.client == "requests":
            answer = session.post(f"{server.url}/rerank", data=body, headers=headers)
            answer.raise_for_status()
            got = answer.headers
        else:
            connection.request("POST", "/rerank", body, headers)
            response = connection.getresponse()
            response.read()
            got = response.headers
        return {part: float(got[f"x-{part}-time"]) for part in ("tokenization", "queue", "inference", "total")}

    try:
        for _ in range(10):  # a bucket's graph is captured on its second hit
            post()
        sent, due = [], time.perf_counter()
        for _ in range(args.requests):
            time.sleep(max(0.0, due - time.perf_counter()))
            due += 1 / args.rate
            began = time.perf_counter()
            split = post()
            sent.append((began, time.perf_counter(), split))
        time.sleep(0.3)
        post()  # the last steps' GPU spans are logged when a later step collects them
        time.sleep(0.3)
    finally:
        server.stop()
    report(sent, [json.loads(line) for line in trace.read_text().splitlines()], args)


def report(sent: list, events: list[dict], args: argparse.Namespace) -> None:
    """Each request's events (those that began while it was in flight), then the medians."""
    rows = []
    for n, (began, ended, split) in enumerate(sent):

        def mine(kind: str, key: str, began: float = began, ended: float = ended) -> list[dict]:
            return [e for e in events if e["ev"] == kind and began <= e[key] <= ended]

        def ms(t: float, began: float = began) -> float:
            return (t - began) * 1e3

        steps, gpu, waits = mine("step", "t0"), mine("gpu", "g0"), mine("wait", "t1")
        rows.append({
            "client": ms(ended), "server_total": split["total"], "tokenization": split["tokenization"],
            "inference": split["inference"], "steps": len(steps),
            "first_step": ms(steps[0]["t0"]) if steps else float("nan"),
            "host_enqueue": statistics.mean((e["t1"] - e["t0"]) * 1e3 for e in steps) if steps else float("nan"),
            "gpu_start": ms(gpu[0]["g0"]) if gpu else float("nan"),
            "gpu_busy": sum((e["g1"] - e["g0"]) * 1e3 for e in gpu),
            "gpu_end": ms(gpu[-1]["g1"]) if gpu else float("nan"),
            "last_wait": ms(waits[-1]["t1"]) if waits else float("nan"),
        })  # fmt: skip
        if n < args.show:
            print(f"request {n}: answered at {ms(ended):.2f} ms; server: tokenization {split['tokenization']:.2f}, "
                  f"inference {split['inference']:.2f}, total {split['total']:.2f}")  # fmt: skip
            for e in steps:
                span = f"{ms(e['t0']):6.2f} -> {ms(e['t1']):6.2f}"
                print(f"   step {e['tokens']:6d} tokens {e['seqs']:3d} sequences, host {span}")
            for e in gpu:
                print(f"   gpu  {ms(e['g0']):6.2f} -> {ms(e['g1']):6.2f} ({(e['g1'] - e['g0']) * 1e3:.2f}) {e['key']}")
            for e in waits:
                print(f"   wait {ms(e['t0']):6.2f} -> {ms(e['t1']):6.2f}")
    medians = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
    print(f"{' '.join(args.server_arg) or 'default flags'}, client {args.client}: medians ms {medians}")


if __name__ == "__main__":
    main()
