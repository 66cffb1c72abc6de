"""Tokenizing on the server: the tokenizers crate's v1 pipeline (`--fast-tokenizer auto`, the
default) against its classic `Tokenizer` (`--fast-tokenizer off`), two ivy-serve processes on the
same model taken in alternating slices. Per workload: the server's x-tokenization-time and the
client's whole request, medians of each side and their ratio (median of the per-slice ratios).

    python benches/tokenizer.py                                   # CPU
    python benches/tokenizer.py --shape bge-reranker-base --device cuda

Workloads: 1 query x 100 documents of ~200 tokens over /rerank (a cross-encoder of `--shape`,
random weights; the MiniLM tokenizer's WordPiece behind the shape's pair template), and 256 such
documents over /embed (the default all-MiniLM-L6-v2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from rerank import SHAPES, workload  # noqa: E402

from support import Server, start_server  # noqa: E402

SIDES = ("auto", "off")


def wait_for_v1(server: Server, timeout: float = 60) -> None:
    """v1 loads in the background after start; the classic tokenizer serves until then."""
    deadline = time.monotonic() + timeout
    while not requests.get(f"{server.url}/info", timeout=10).json()["fast_tokenizer"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"v1 was not in use after {timeout} s: see {server.log}")
        time.sleep(0.2)


def measure(servers: dict[str, Server], route: str, body: dict, rounds: int, requests_per_slice: int) -> None:
    session = requests.Session()
    for server in servers.values():  # warm: a bucket's graph is captured on its second hit
        for _ in range(3):
            session.post(f"{server.url}{route}", json=body, timeout=600).raise_for_status()
    tokenizing = {side: [] for side in servers}
    whole = {side: [] for side in servers}
    ratios = []
    for _ in range(rounds):
        medians = {}
        for side, server in servers.items():
            slice_times = []
            for _ in range(requests_per_slice):
                began = time.perf_counter()
                answer = session.post(f"{server.url}{route}", json=body, timeout=600)
                whole[side].append((time.perf_counter() - began) * 1000)
                answer.raise_for_status()
                slice_times.append(float(answer.headers["x-tokenization-time"]))
            tokenizing[side] += slice_times
            medians[side] = statistics.median(slice_times)
        ratios.append(medians["off"] / max(medians["auto"], 1e-3))
    cells = [f"{statistics.median(tokenizing[s]):.2f} / {statistics.median(whole[s]):.1f}" for s in SIDES]
    print(f"| {route} | {cells[0]} | {cells[1]} | {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)}) |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="ms-marco-minilm")
    parser.add_argument("--docs", type=int, default=100, help="documents of the rerank request")
    parser.add_argument("--batch", type=int, default=256, help="documents of the /embed request")
    parser.add_argument("--rounds", type=int, default=4, help="alternating slices of each side")
    parser.add_argument("--requests", type=int, default=4, help="requests per slice")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--server-arg", action="append", default=[], help="extra ivy-serve flag (repeatable)")
    args = parser.parse_args()

    folder, query, docs = workload(args.shape, max(args.docs, args.batch))
    logs = Path(tempfile.mkdtemp())
    print(f"{args.device}; rerank: {args.shape}, 1 x {args.docs}; embed: all-MiniLM-L6-v2, {args.batch} documents "
          f"of ~200 tokens; {args.rounds} alternating slices of {args.requests} requests a side")  # fmt: skip
    print("| workload | v1 (auto): tokenizing / request ms | classic (off): tokenizing / request ms "
          "| tokenizing, classic / v1 (per slice) |")  # fmt: skip
    print("|---|---|---|---|")
    for route, model_flags, body in (
        ("/rerank", ["--model", str(folder)], {"query": query, "texts": docs[: args.docs], "truncate": True}),
        ("/embed", [], {"inputs": docs[: args.batch], "truncate": True}),
    ):
        servers = {}
        try:
            for side in SIDES:
                flags = [*model_flags, "--device", args.device, "--fast-tokenizer", side, *args.server_arg]
                servers[side] = start_server(logs, *flags)
            wait_for_v1(servers["auto"])
            measure(servers, route, body, args.rounds, args.requests)
        finally:
            for server in servers.values():
                server.stop()


if __name__ == "__main__":
    main()
