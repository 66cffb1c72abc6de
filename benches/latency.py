"""Online latency on the GPU: CUDA graphs against eager runs, in the engine and over HTTP.

    python benches/latency.py [--qwen3 0.6b] [--iterations 300]
    python benches/latency.py --device cpu --qwen3 tiny    # the harness's share, without a GPU
    python benches/latency.py --qwen3 0.6b --startup-only --starts 6   # only the starts, each timed

Engine: p50/p99 from step() to the vectors on the host, for one 16-token query and for eight
32-token queries, with --cuda-graphs lazy (warmed: captured) and off. HTTP: the same requests,
as token ids, to a real ivy-serve on loopback, one at a time, timed by the client and by the
server (its x-total-time header, and the split of it: tokenization, queue, inference, transfer);
plus the time from starting the process to its first answer, with lazy capture. On the CPU only
the eager rows are taken (CUDA graphs and GPU time are the GPU's).
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import requests
import torch
from gpu_check import SERVER_TIMES

import rose

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import free_port, start_server  # noqa: E402

SHAPES = {"1 x 16 tokens": (1, 16), "8 x 32 tokens": (8, 32)}


def engine_latencies(engine: rose.Engine, sequences: int, length: int, iterations: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    cu = np.arange(0, sequences * length + 1, length, dtype=np.int32)
    batches = [rng.integers(1000, 20000, size=sequences * length, dtype=np.int32) for _ in range(16)]
    for ids in batches[:4]:  # warm-up: eager run, capture
        engine.step(ids, cu).wait()
    out = []
    for i in range(iterations):
        start = time.perf_counter()
        engine.step(batches[i % len(batches)], cu).wait()
        out.append(time.perf_counter() - start)
    return np.array(out) * 1000


def gpu_milliseconds(engine: rose.Engine, sequences: int, length: int, iterations: int = 50) -> np.ndarray:
    """GPU time from a step's first operation to its last (CUDA events on the engine's stream):
    what is left of the latency once the host's share is taken out."""
    cu = np.arange(0, sequences * length + 1, length, dtype=np.int32)
    ids = np.full(sequences * length, 1000, dtype=np.int32)
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        lazy = engine.step(ids, cu)
        end.record()
        lazy.wait()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return np.array(times)


def kernel_table(engine: rose.Engine, sequences: int, length: int) -> str:
    """The CUDA kernels of one eager step, by GPU time, with their launch counts."""
    from torch.profiler import ProfilerActivity, profile

    cu = np.arange(0, sequences * length + 1, length, dtype=np.int32)
    ids = np.full(sequences * length, 1000, dtype=np.int32)
    engine.step(ids, cu).wait()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step(ids, cu).wait()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1000
    head = f"one eager step of {sequences} x {length} tokens: {len(kernels)} kernels, {busy:.3f} ms of kernel time"
    return head + "\n" + prof.key_averages().table(sort_by="self_device_time_total", row_limit=12)


def http_latencies(url: str, sequences: int, length: int, iterations: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Client-side round trips (a keep-alive http.client connection, bodies serialized ahead) and
    the server's own times (x-total-time and its parts), in milliseconds."""
    rng = np.random.default_rng(1)
    parts = urlsplit(url)
    path = parts.path
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {"content-type": "application/json"}
    bodies = [
        json.dumps({"input": [rng.integers(1000, 20000, size=length).tolist() for _ in range(sequences)]})
        for _ in range(iterations + 8)
    ]
    client: list[float] = []
    server: dict[str, list[float]] = {name: [] for name in SERVER_TIMES}
    for i, body in enumerate(bodies):
        start = time.perf_counter()
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - start
        assert response.status == 200
        if i >= 8:
            client.append(elapsed * 1000)
            for name, times in server.items():
                times.append(float(response.getheader(f"x-{name}-time")))
    return np.array(client), {name: np.array(times) for name, times in server.items()}


def time_to_first_answer(work: Path, folder: Path | None, device: str) -> tuple[float, float, float, dict]:
    """Seconds from starting ivy-serve until /health answers, until a first embedding (one 16-token
    query) is back and until a first batch (4 x 16 tokens, sent after it) is back, and the
    engine's own start-up phases from /info."""
    port, grpc = free_port(), free_port()
    command = ["ivy-serve", "--hostname", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc)]
    command += ["--device", device] + (["--model", str(folder)] if folder else [])
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=(work / "first.log").open("w"), stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.perf_counter() - start > 600:
                raise RuntimeError((work / "first.log").read_text())
            time.sleep(0.01)
        ready = time.perf_counter() - start
        body = {"input": [[1000 + i for i in range(16)]]}
        assert requests.post(f"http://127.0.0.1:{port}/v1/embeddings", json=body, timeout=60).status_code == 200
        first = time.perf_counter() - start
        body = {"input": [[2000 + 16 * i + j for j in range(16)] for i in range(4)]}
        assert requests.post(f"http://127.0.0.1:{port}/v1/embeddings", json=body, timeout=60).status_code == 200
        batch = time.perf_counter() - start
        info = requests.get(f"http://127.0.0.1:{port}/info", timeout=10).json()
        return ready, first, batch, info["engine"].get("startup_seconds", {})
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen3", choices=["tiny", "0.6b"], help="random Qwen3 of this shape instead of MiniLM")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--engine-only", action="store_true", help="skip the HTTP rows and the start-up timing")
    parser.add_argument("--attention-backend", default="auto", help="ROSE's attention backend (default auto)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--starts", type=int, default=1, help="ivy-serve starts timed to their first answer")
    parser.add_argument("--startup-only", action="store_true", help="only time ivy-serve's starts")
    args = parser.parse_args()
    on_gpu = args.device == "cuda"
    modes = () if args.startup_only else ("lazy", "off") if on_gpu else ("off",)
    work = Path(tempfile.mkdtemp())
    folder = None
    if args.qwen3:
        from support import save_qwen3

        folder = save_qwen3(work / f"qwen3-{args.qwen3}", args.qwen3, bidirectional=False)
    model = f"Qwen3 {args.qwen3} shape (random weights)" if folder else "all-MiniLM-L6-v2"
    # Rows are printed as they are measured, so that a run cut short still reports.
    device = torch.cuda.get_device_name() if on_gpu else "CPU (float32)"
    print(f"{model}, {device}, attention {args.attention_backend}, {args.iterations} requests each, one at a time")
    if not args.startup_only:
        print("| path | CUDA graphs | request | p50 ms | p99 ms |")
        print("|---|---|---|---|---|")

    def row(path: str, graphs: str, name: str, ms: np.ndarray) -> None:
        print(f"| {path} | {graphs} | {name} | {np.percentile(ms, 50):.3f} | {np.percentile(ms, 99):.3f} |", flush=True)

    for graphs in modes:
        engine = rose.Engine(
            folder, device=args.device, cuda_graphs=graphs, attention_backend=args.attention_backend, verify=False
        )
        for name, (n, length) in SHAPES.items():
            row("engine", graphs, name, engine_latencies(engine, n, length, args.iterations))
            if on_gpu:
                row("engine, GPU time", graphs, name, gpu_milliseconds(engine, n, length))
        if graphs == "off" and on_gpu:
            print(kernel_table(engine, 1, 16), flush=True)
        del engine
        if on_gpu:
            torch.cuda.empty_cache()
    if args.engine_only:
        return
    splits = []
    for graphs in modes:
        extra = ["--device", args.device, "--cuda-graphs", graphs, "--attention-backend", args.attention_backend]
        extra += ["--model", str(folder)] if folder else []
        server = start_server(work, *extra)
        try:
            server.settle()
            for name, (n, length) in SHAPES.items():
                ms, inside = http_latencies(f"{server.url}/v1/embeddings", n, length, args.iterations)
                row("HTTP", graphs, name, ms)
                row("HTTP, server side", graphs, name, inside["total"])
                splits.append((graphs, name, {k: float(np.percentile(v, 50)) for k, v in inside.items()}))
        finally:
            server.stop()
    if splits:
        print("\n| CUDA graphs | request | server total | tokenization | queue | inference | transfer | rest (Ivy) |")
        print("|---|---|---|---|---|---|---|---|")
        for graphs, name, p50 in splits:
            rest = p50["total"] - sum(p50[k] for k in SERVER_TIMES[1:])
            print(f"| {graphs} | {name} | " + " | ".join(f"{p50[k]:.3f}" for k in SERVER_TIMES) + f" | {rest:.3f} |")
        print("(p50 ms of each of the server's x-*-time headers: the parts' p50s need not add up to the total's)")
    firsts = []
    for _ in range(args.starts):
        ready, first, batch, phases = time_to_first_answer(work, folder, args.device)
        firsts.append(first)
        print(f"\nivy-serve start to /health: {ready:.2f} s; to the first embedding: {first:.2f} s (lazy capture);")
        print(f"to a first batch of 4 x 16 tokens after it: {batch:.2f} s")
        print("engine start-up phases (s):", ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
    if args.starts > 1:
        print(f"\nfirst answers (s): {', '.join(f'{f:.2f}' for f in firsts)}; median {np.median(firsts):.2f}")


if __name__ == "__main__":
    main()
