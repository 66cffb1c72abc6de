"""The whole stack against what users would pick instead, in one run.

    python benches/stack.py --quick                    # CPU, all-MiniLM-L6-v2, under a minute
    python benches/stack.py                            # the default model on the GPU if there is one
    python benches/stack.py --qwen3 0.6b               # Qwen3-0.6B shape, random weights

Configurations, on the same prose (benches/corpus.py): ROSE alone in-process (on token ids
tokenized ahead, so that the stack is priced with its tokenization), the whole stack
(ivy-serve as a real process) over HTTP and over gRPC, and the model's reference implementation
(sentence-transformers, or Hugging Face transformers with padded batches for Qwen3). Patterns:
batch re-indexing (client batches of 32-256 documents of 128-512 tokens, many in flight) and
online search (one query of 5-30 tokens per request, closed loop at several concurrencies and
at fixed arrival rates). The batch runs alternate (ROSE in-process, HTTP, gRPC, ROSE in-process,
...) and each stack run is priced against the in-process runs on either side of it, since the
machine's speed drifts over minutes. The time split (tokenization, queue, inference, transfer)
comes from Ivy's /metrics. Writes report.json and two PNG plots to --out; prints the tables last.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import torch

import rose
import tulip
from corpus import documents, queries
from cpu_threads import cores_busy, describe, thread_cpu
from inprocess import embed_packed, tokenizer
from timing import best_of

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import Server, start_server  # noqa: E402

SPLIT = ("tokenization", "queue", "inference", "transfer")


def percentiles(latencies: list[float]) -> dict[str, float]:
    ms = np.array(latencies) * 1000
    return {f"p{p}": float(np.percentile(ms, p)) for p in (50, 95, 99)}


# Histograms read from /metrics, under the names the report uses.
HISTOGRAMS = {f"ivy_{part}_duration_seconds": part for part in SPLIT} | {"tulip_batch_tokens": "step_tokens"}


def scrape(server: Server) -> dict[str, float]:
    """Ivy's and Tulip's histograms' sums and counts, and the tokenizer pool's busy seconds."""
    import requests

    out = {}
    for line in requests.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        metric, _, suffix = name.rpartition("_")
        if metric in HISTOGRAMS and suffix in ("sum", "count"):
            out[f"{HISTOGRAMS[metric]}_{suffix}"] = float(value)
        elif name == "ivy_tokenizer_busy_microseconds_total":
            out["tokenizer_busy"] = float(value) / 1e6
    return out


def mean_between(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """A histogram's mean over what it recorded between two scrapes."""
    count = after.get(name + "_count", 0) - before.get(name + "_count", 0)
    return (after.get(name + "_sum", 0) - before.get(name + "_sum", 0)) / count if count else float("nan")


def tokenizer_load(before: dict[str, float], after: dict[str, float], seconds: float, workers: int) -> float:
    """The tokenizer pool's busy share over a run: 1.0 would make tokenization the bottleneck."""
    return (after.get("tokenizer_busy", 0) - before.get("tokenizer_busy", 0)) / (seconds * workers)


def cpu_mark(server: Server) -> tuple[dict[str, float], float]:
    """CPU seconds so far: the server's per thread group, and this load generator's."""
    return thread_cpu(server.process.pid), time.process_time()


def cpu_use(server: Server, mark: tuple[dict[str, float], float], seconds: float) -> dict:
    """Cores kept busy since `mark`: in the server per thread group, and in the load generator."""
    threads, client = mark
    return {
        "server": cores_busy(threads, thread_cpu(server.process.pid), seconds),
        "load_generator": (time.process_time() - client) / seconds,
    }


def tokens_per_step(before: dict[str, float], after: dict[str, float]) -> float:
    """Mean tokens in the engine steps Tulip ran between two scrapes."""
    return mean_between(before, after, "step_tokens")


def split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean milliseconds per request in each part, between two scrapes."""
    return {part: 1000 * mean_between(before, after, part) for part in SPLIT}


async def http_closed_loop(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float]]:
    """Sends `bodies` with `concurrency` requests in flight; returns (seconds, latencies)."""
    latencies: list[float] = []
    queue = list(reversed(bodies))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                start = time.perf_counter()
                async with session.post(url, json=body) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {await response.text()}")
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies


async def http_open_loop(url: str, bodies: list[dict], rate: float) -> tuple[float, list[float]]:
    """Sends one body every 1/rate seconds whatever the answers; latency counts from the planned
    send time, so that a stalled server is not hidden (no coordinated omission)."""
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()

        async def one(i: int, body: dict) -> None:
            planned = start + i / rate
            await asyncio.sleep(max(0.0, planned - time.perf_counter()))
            async with session.post(url, json=body) as response:
                await response.read()
            latencies.append(time.perf_counter() - planned)

        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        return time.perf_counter() - start, latencies


def grpc_closed_loop(address: str, batches: list[list[str]], concurrency: int) -> tuple[float, list[float]]:
    client = tulip.Client(address)
    latencies: list[float] = []

    def one(batch: list[str]) -> None:
        start = time.perf_counter()
        client.embed(batch, truncate=True)
        latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, batches))
    return time.perf_counter() - start, latencies


def token_counter(model_dir: rose.ModelDir) -> Callable[[str], int]:
    """Counts a text's tokens as the model's tokenizer makes them, without truncation."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(model_dir.tokenizer_json().decode())
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return lambda text: len(tokenizer.encode(text).ids)


class RoseInProcess:
    """ROSE alone: the engine on the documents' token ids, tokenized ahead (the stack's
    tokenization is part of the harness that the comparison prices)."""

    def __init__(self, folder: Path | None, device: str, docs: list[str], rounds: int) -> None:
        self.engine = rose.Engine(folder, device=device)
        # As arrays: packing them into a step costs the host next to nothing, as Tulip's does.
        ids = [np.array(e.ids, dtype=np.int32) for e in tokenizer(self.engine).encode_batch(docs)]
        self.tokens = sum(len(i) for i in ids) * rounds
        self.ids = ids * rounds
        # Lazy CUDA graphs run a bucket's first hit eagerly and capture on the second.
        for _ in range(2 if self.engine.device.type == "cuda" else 1):
            embed_packed(self.engine, ids)

    def run(self) -> dict:
        """One run over the documents, `rounds` times in one call: its rate, and the GPU's idle share
        between its steps (None on the CPU)."""
        self.engine.stats()
        start = time.perf_counter()
        embed_packed(self.engine, self.ids)
        seconds = time.perf_counter() - start
        idle = self.engine.stats().get("gpu_idle_fraction")  # absent on the CPU
        return {"seconds": seconds, "tokens_s": self.tokens / seconds, "gpu_idle": idle}


def batch_run(server: Server, tokens: int, send: Callable[[], tuple[float, list[float]]]) -> dict:
    """One batch run of the stack: its rate and latency, and what Ivy's and Tulip's metrics, /proc and
    the engine say about it."""
    workers = server_info(server)["tokenization_workers"]  # also starts the idle-share window
    before, mark = scrape(server), cpu_mark(server)
    seconds, latencies = send()
    cpu = cpu_use(server, mark, seconds)
    after = scrape(server)
    return {"seconds": seconds, "tokens_s": tokens / seconds, **percentiles(latencies),
            "split_ms": split(before, after), "step_tokens": tokens_per_step(before, after),
            "tokenizer_load": tokenizer_load(before, after, seconds, workers), "cpu": cpu,
            "gpu_idle": gpu_idle(server)}  # fmt: skip


def reference_seconds(folder: Path | None, device: str, docs: list[str], repeats: int) -> tuple[str, float]:
    name, encode = reference_encoder(folder, device)
    seconds = best_of(lambda: encode(docs), repeats)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return name, seconds


def reference_encoder(folder: Path | None, device: str) -> tuple[str, Callable[[list[str]], object]]:
    """The implementation users would pick instead for this model."""
    path = folder or rose.default_model_path()
    if (path / "modules.json").is_file():
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(path), device=device)
        return "sentence-transformers", lambda texts: model.encode(texts, batch_size=64)
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding()
    tokenizer.enable_truncation(512)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device).eval()

    def encode(texts: list[str]) -> None:
        with torch.inference_mode():
            for i in range(0, len(texts), 64):
                encodings = tokenizer.encode_batch(texts[i : i + 64])
                ids = torch.tensor([e.ids for e in encodings], device=device)
                mask = torch.tensor([e.attention_mask for e in encodings], device=device)
                model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1].float().cpu()

    return "transformers (padded)", encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU, small counts, batch pattern and a short online run")
    parser.add_argument("--model", type=Path, help="model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--qwen3", choices=["tiny", "0.6b"], help="generate a random Qwen3 model of this shape")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--docs", type=int, default=4096)
    parser.add_argument("--queries", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--batch-concurrency", type=int, default=16)
    parser.add_argument(
        "--batch-rounds", type=int, default=1, help="send the documents this many times in each batch run, "
        "for a run long enough to be past its ramp when the engine is fast"
    )  # fmt: skip
    parser.add_argument(
        "--alternations", type=int, default=3, help="batch runs of each configuration, taken in turn "
        "(in-process, HTTP, gRPC, in-process, ...); the ratios reported are the medians"
    )  # fmt: skip
    parser.add_argument("--client-batch", type=int, nargs=2, default=[32, 256], help="documents per request, range")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    parser.add_argument("--server-arg", action="append", default=[], help="extra ivy-serve flag (repeatable)")
    args = parser.parse_args()
    if args.quick:
        args.device, args.docs, args.queries, args.concurrency, args.rates = "cpu", 64, 80, [1, 16], [50]
        args.batch_concurrency, args.client_batch, args.alternations = 4, [16, 32], 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    folder = args.model
    if args.qwen3:
        from support import save_qwen3

        folder = save_qwen3(work / f"qwen3-{args.qwen3}", args.qwen3, bidirectional=False)

    model_dir = rose.ModelDir.open(folder)
    count = token_counter(model_dir)
    max_doc = min(512, model_dir.max_input_length)
    docs = documents(args.docs, min(128, max_doc // 2), max_doc, count)
    doc_tokens = sum(count(d) for d in docs)
    rng = random.Random(0)
    client_batches: list[list[str]] = []
    while sum(map(len, client_batches)) < len(docs):
        start = sum(map(len, client_batches))
        client_batches.append(docs[start : start + rng.randint(*args.client_batch)])
    online = queries(args.queries, 5, 30, count)
    report: dict = {"device": args.device, "model": model_dir.model_id, "docs": len(docs),
                    "doc_tokens": doc_tokens, "queries": len(online), "cores": os.cpu_count()}  # fmt: skip
    print(f"{len(docs)} documents ({doc_tokens} tokens) in {len(client_batches)} client batches; "
          f"{len(online)} queries; {args.device}; {report['model']}", flush=True)  # fmt: skip

    # In-process: ROSE alone, and the reference implementation, each timed once after a warm-up as the stack's
    # batch runs are (on 2 noisy cores a best-of on one side only would tilt the ratio).
    in_process = RoseInProcess(folder, args.device, docs, args.batch_rounds)
    in_process_runs = [in_process.run()]
    name, seconds = reference_seconds(folder, args.device, docs, repeats=1 if args.quick else 2)
    in_process_runs.append(in_process.run())
    reference = {"seconds": seconds, "tokens_s": doc_tokens / seconds}
    print(f"in-process: ROSE {in_process_runs[0]['tokens_s']:,.0f}, {name} {reference['tokens_s']:,.0f}, ROSE "
          f"{in_process_runs[1]['tokens_s']:,.0f} tokens/s", flush=True)  # fmt: skip

    # The whole stack, as a real process.
    server_args = ["--device", args.device, *args.server_arg] + (["--model", str(folder)] if folder else [])
    server = start_server(work, *server_args)
    try:
        server.settle()
        url = f"{server.url}/v1/embeddings"
        bodies = [{"input": b} for b in client_batches]
        asyncio.run(http_closed_loop(url, bodies[:4], 2))  # warm-up: lazy graphs, connections
        grpc_closed_loop(server.grpc, client_batches[:4], 2)
        report["tokenization_workers"] = server_info(server)["tokenization_workers"]

        # The batch pattern in alternation: ROSE in-process, HTTP, gRPC, ROSE in-process, ... Each stack run is
        # priced against the mean of the in-process runs on either side of it: the VM's speed drifts by more
        # than the harness costs, so runs taken minutes apart cannot be compared.
        tokens = doc_tokens * args.batch_rounds
        http_runs: list[dict] = []
        grpc_runs: list[dict] = []
        for _ in range(args.alternations):
            http_runs.append(batch_run(server, tokens, lambda: asyncio.run(
                http_closed_loop(url, bodies * args.batch_rounds, args.batch_concurrency))))  # fmt: skip
            grpc_runs.append(batch_run(server, tokens, lambda: grpc_closed_loop(
                server.grpc, client_batches * args.batch_rounds, args.batch_concurrency)))  # fmt: skip
            in_process_runs.append(in_process.run())
            print(f"in-process {in_process_runs[-2]['tokens_s']:,.0f}, HTTP {http_runs[-1]['tokens_s']:,.0f}, "
                  f"gRPC {grpc_runs[-1]['tokens_s']:,.0f}, in-process {in_process_runs[-1]['tokens_s']:,.0f} "
                  "tokens/s", flush=True)  # fmt: skip
        report["batch"] = {"rose in-process": in_process_runs, name: [reference], "stack over HTTP": http_runs,
                           "stack over gRPC": grpc_runs}  # fmt: skip
        # Each run against the mean of the in-process runs on either side of it: the reference sits between the
        # first two, the i-th HTTP and gRPC runs between the (i+1)-th and (i+2)-th.
        around = [np.mean([a["tokens_s"], b["tokens_s"]]) for a, b in itertools.pairwise(in_process_runs)]
        report["batch_vs_in_process"] = {
            name: [reference["tokens_s"] / around[0]],
            "stack over HTTP": [r["tokens_s"] / m for r, m in zip(http_runs, around[1:], strict=True)],
            "stack over gRPC": [r["tokens_s"] / m for r, m in zip(grpc_runs, around[1:], strict=True)],
        }

        online_rows = []
        query_bodies = [{"input": q} for q in online]
        asyncio.run(http_closed_loop(url, query_bodies[:64], 8))
        for concurrency in args.concurrency:
            before = scrape(server)
            seconds, latencies = asyncio.run(http_closed_loop(url, query_bodies, concurrency))
            online_rows.append({"load": f"closed loop x{concurrency}", "req_s": len(online) / seconds,
                                **percentiles(latencies), "split_ms": split(before, scrape(server))})  # fmt: skip
            print(f"online {online_rows[-1]['load']}: {online_rows[-1]['p50']:.2f} ms p50", flush=True)
        for rate in args.rates:
            n = min(len(query_bodies), int(rate * 4))
            before = scrape(server)
            seconds, latencies = asyncio.run(http_open_loop(url, query_bodies[:n], rate))
            online_rows.append({"load": f"{rate:g} req/s offered", "req_s": n / seconds,
                                **percentiles(latencies), "split_ms": split(before, scrape(server))})  # fmt: skip
        report["online_http"] = online_rows
        grpc_rows = []
        for concurrency in args.concurrency[:2]:
            seconds, latencies = grpc_closed_loop(server.grpc, [[q] for q in online], concurrency)
            grpc_rows.append(
                {"load": f"closed loop x{concurrency}", "req_s": len(online) / seconds, **percentiles(latencies)}
            )
        report["online_grpc"] = grpc_rows
    finally:
        server.stop()

    report["harness_overhead"] = 1 - float(np.median(report["batch_vs_in_process"]["stack over HTTP"]))
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out)
    print_tables(report)


def server_info(server: Server) -> dict:
    """Ivy's /info; each call also ends the engine's idle-share window."""
    import requests

    return requests.get(f"{server.url}/info", timeout=10).json()


def gpu_idle(server: Server) -> float | None:
    """The GPU's idle share between steps since the previous /info call (None on the CPU)."""
    return (server_info(server).get("engine") or {}).get("gpu_idle_fraction")


def median_rates(report: dict) -> dict[str, float]:
    """Each batch configuration's median tokens/s over its runs."""
    return {name: float(np.median([r["tokens_s"] for r in runs])) for name, runs in report["batch"].items()}


def median_of(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(np.median(values)) if values else float("nan")


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, marker in (("closed loop", "o"), ("offered", "s")):
        rows = sorted((r for r in report["online_http"] if kind in r["load"]), key=lambda r: r["req_s"])
        for p in ("p50", "p99"):
            ax.plot([r["req_s"] for r in rows], [r[p] for r in rows], marker=marker, label=f"{p}, {kind}")
    ax.set(xlabel="requests/s achieved", ylabel="latency (ms)", title=f"online queries over HTTP ({report['device']})")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    rates = median_rates(report)
    ax.barh(list(rates), list(rates.values()))
    for y, runs in enumerate(report["batch"].values()):
        ax.plot([r["tokens_s"] for r in runs], [y] * len(runs), "k|", markersize=14)
    ax.set(xlabel="tokens/s (bars: median; ticks: each run)", title=f"batch re-indexing ({report['device']})")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)


def print_tables(report: dict) -> None:
    rates, shares = median_rates(report), report["batch_vs_in_process"]
    runs = ", ".join(f"{r['tokens_s']:,.0f}" for r in report["batch"]["rose in-process"])
    print(f"\nROSE in-process, in the order taken: {runs} tokens/s")
    print("\n| batch pattern | tokens/s, median | runs | vs ROSE in-process: median (each run against the "
          "in-process runs on either side) |")  # fmt: skip
    print("|---|---|---|---|")
    for name, rate in rates.items():
        each = ", ".join(f"{s:.0%}" for s in shares.get(name, [1.0]))
        median = float(np.median(shares.get(name, [1.0])))
        print(f"| {name} | {rate:,.0f} | {len(report['batch'][name])} | {median:.0%} ({each}) |")
    http, grpc = report["batch"]["stack over HTTP"], report["batch"]["stack over gRPC"]
    parts = ", ".join(f"{k} {np.median([r['split_ms'][k] for r in http]):.2f}" for k in SPLIT)
    print(f"\nbatch over HTTP, medians over its runs: request latency p50 {median_of(http, 'p50'):.1f} ms, p99 "
          f"{median_of(http, 'p99'):.1f} ms; per request (ms): {parts}")  # fmt: skip
    if report["device"] != "cpu":
        all_runs = (report["batch"]["rose in-process"], http, grpc)
        idle = " / ".join(f"{median_of(runs, 'gpu_idle'):.1%}" for runs in all_runs)
        print(f"GPU idle between steps in the batch runs (medians), in-process / HTTP / gRPC: {idle}")
    print(f"mean tokens per engine step in the batch runs (medians), HTTP / gRPC: "
          f"{median_of(http, 'step_tokens'):,.0f} / {median_of(grpc, 'step_tokens'):,.0f}")  # fmt: skip
    print(f"tokenizer pool busy during the HTTP batch runs: {median_of(http, 'tokenizer_load'):.1%} "
          f"of {report['tokenization_workers']} workers")  # fmt: skip
    for run, runs in (("HTTP", http), ("gRPC", grpc)):
        cpu = runs[len(runs) // 2]["cpu"]
        print(f"cores busy during the middle {run} batch run, of {report['cores']}: server {describe(cpu['server'])}; "
              f"load generator {cpu['load_generator']:.2f}")  # fmt: skip
    print("\n| online load | req/s | p50 ms | p95 ms | p99 ms | tokenize / queue / infer / transfer ms |")
    print("|---|---|---|---|---|---|")
    for r in report["online_http"]:
        s = r["split_ms"]
        parts = " / ".join(f"{s[k]:.2f}" for k in SPLIT)
        print(f"| {r['load']} | {r['req_s']:,.0f} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} | {parts} |")
    print("\n| online load over gRPC | req/s | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for r in report["online_grpc"]:
        print(f"| {r['load']} | {r['req_s']:,.0f} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} |")
    print(f"\nharness overhead at saturation (1 - HTTP / in-process): {report['harness_overhead']:.1%}")


if __name__ == "__main__":
    main()
