"""The whole engine checked and timed in one call on a GPU: the GPU tests, then the four figures
that a change to ROSE must keep (Qwen3-0.6B shape, random weights in bf16, a real ivy-serve):

1. batch tokens/s over HTTP on mixed 32-512-token documents;
2. one 16-token query, p50 in the engine (step() to vectors on the host) and over HTTP;
3. the first answer after ivy-serve starts;
4. the worst start-up fidelity cosine (every tier, the deferred ones included).

    python benches/gpu_check.py [--tests] [--model DIR] [--label NAME]

It uses only what every wheel since e1f1c50 has (the ivy-serve command, its HTTP API, rose.Engine
and step()), so the wheels before and after a change run it in turn in one machine start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import free_port, save_qwen3  # noqa: E402

SERVER_TIMES = ("total", "tokenization", "queue", "inference", "transfer")
"""Ivy's timing headers (x-NAME-time, ms): where a request's time went inside the server."""


def documents(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Token ids of `count` documents of 32-512 tokens."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, vocab, size=int(n)).tolist() for n in rng.integers(32, 513, size=count)]


def start(folder: Path, device: str, log: Path) -> tuple[subprocess.Popen, str, float]:
    """ivy-serve on free ports; returns once a 16-token query is answered, with the seconds it took."""
    port = free_port()
    command = ["ivy-serve", "--model", str(folder), "--device", device, "--hostname", "127.0.0.1",
               "--port", str(port), "--grpc-port", str(free_port())]  # fmt: skip
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    query = {"input": [list(range(1000, 1016))]}
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"ivy-serve exited:\n{log.read_text()[-3000:]}")
        try:
            if requests.post(f"{url}/v1/embeddings", json=query, timeout=5).status_code == 200:
                return process, url, time.perf_counter() - began
        except requests.RequestException:
            pass
        time.sleep(0.01)


def batch_rate(url: str, docs: list[list[int]], client_batch: int = 64, concurrency: int = 16) -> float:
    """Tokens/s of the documents sent as client batches over /v1/embeddings."""
    batches = [docs[i : i + client_batch] for i in range(0, len(docs), client_batch)]
    sessions = [requests.Session() for _ in range(concurrency)]

    def send(i: int) -> None:
        response = sessions[i % concurrency].post(f"{url}/v1/embeddings", json={"input": batches[i]}, timeout=300)
        response.raise_for_status()

    began = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, range(len(batches))))
    return sum(map(len, docs)) / (time.perf_counter() - began)


FUSED_KERNELS = ("fused_swiglu", "fused_qk_rope")
"""/info's engine keys of the kernels that large steps take once loaded (rose.ops.large_steps)."""


def settle(url: str, warm: Callable[[], object], limit: float = 120) -> None:
    """More warm rounds (`warm`) while the server's kernels for large steps load (they start on the
    first large step and take seconds; /info's engine.fused_swiglu and engine.fused_qk_rope), then
    one for its large steps' graphs to be captured again: the state a long load runs in. Wheels
    without them return at once."""
    began, rounds = time.perf_counter(), 0
    while True:
        engine = requests.get(f"{url}/info", timeout=30).json().get("engine") or {}
        loading = [name for name in FUSED_KERNELS if (engine.get(name) or {}).get("state") == "loading"]
        if not loading:
            break
        if time.perf_counter() - began > limit:
            raise RuntimeError(f"{', '.join(loading)} did not load within {limit} s")
        warm()
        rounds += 1
    if rounds:
        warm()


def http_query_p50(url: str, iterations: int) -> float:
    session = requests.Session()
    times = []
    for i in range(iterations):
        body = {"input": [[1000 + (i * 7 + j) % 50000 for j in range(16)]]}
        began = time.perf_counter()
        session.post(f"{url}/v1/embeddings", json=body, timeout=30).raise_for_status()
        times.append(time.perf_counter() - began)
    return statistics.median(times[iterations // 10 :]) * 1000


def worst_fidelity(url: str) -> float | None:
    """The worst cosine of every tier checked so far (start-up's, the deferred short and long ones,
    the large steps' once the fused SwiGLU is in); None where the engine checks nothing (float32
    on the CPU)."""
    report = requests.get(f"{url}/info", timeout=30).json()["engine"]["fidelity"]
    if not report:
        return None
    tiers = [report] + [report[k] for k in ("short_batches", "long_batches", "large_batches") if k in report]
    return min(t["worst_cosine"] for t in tiers)


def engine_query_p50(folder: Path, device: str, iterations: int) -> float:
    """One 16-token query in the engine, step() to vectors on the host, in a process of its own."""
    code = f"""
import time, statistics, numpy as np, rose
engine = rose.Engine({str(folder)!r}, device={device!r})
cu = np.array([0, 16], dtype=np.int32)
ids = [np.arange(1000 + i, 1016 + i, dtype=np.int32) for i in range(64)]
times = []
for i in range({iterations}):
    began = time.perf_counter()
    engine.step(ids[i % 64], cu).wait()
    times.append(time.perf_counter() - began)
print(statistics.median(times[{iterations} // 10:]) * 1000)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", action="store_true", help="run pytest tests/gpu first")
    parser.add_argument("--model", type=Path, help="model folder (default: a random Qwen3-0.6B shape)")
    parser.add_argument("--label", default="this-wheel")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=400)
    args = parser.parse_args()

    if args.tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "faulthandler_timeout=300", "tests/gpu"])
        print(f"tests/gpu exit code {tests.returncode}")
    folder = args.model or Path(tempfile.gettempdir()) / "gpu-check-qwen3-0.6b"
    if not (folder / "config.json").exists():
        save_qwen3(folder, "0.6b", bidirectional=False)
    process, url, first_answer = start(folder, args.device, Path(tempfile.gettempdir()) / f"gpu-check-{args.label}.log")
    try:
        docs = documents(args.docs, json.loads((folder / "config.json").read_text())["vocab_size"])
        batch_rate(url, docs)  # warm: every bucket's eager run and capture
        settle(url, lambda: batch_rate(url, docs))
        rates = [batch_rate(url, docs) for _ in range(3)]
        http_p50 = http_query_p50(url, args.iterations)
        fidelity = worst_fidelity(url)
    finally:
        process.terminate()
        process.wait(timeout=60)
    engine_p50 = engine_query_p50(folder, args.device, args.iterations)
    figures = {
        "label": args.label,
        "batch_tokens_s_http": round(statistics.median(rates)),
        "batch_runs": [round(r) for r in rates],
        "query_p50_ms_engine": round(engine_p50, 3),
        "query_p50_ms_http": round(http_p50, 3),
        "first_answer_s": round(first_answer, 2),
        "worst_fidelity_cosine": None if fidelity is None else round(fidelity, 6),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
