"""ivy-serve against vLLM and transformers on the same model folder, documents and client, in one
machine start (GPU): batch tokens/s over the OpenAI route on mixed 32-512-token documents and one
16-token query's p50/p99 at a steady rate, for each side; vLLM's offline `LLM.embed` as its best
case; transformers bf16 with length-sorted padded batches.

    python benches/peers.py --model DIR --ivy bf16= --ivy "fp8=--dtype fp8" \\
        --vllm-env .gpu-vllm/env-vllm.sh --out $OUT/peers

Both servers are up together (vLLM capped by --vllm-memory) and the batch rounds alternate
between them. The documents are token ids, so both sides embed the same tokens; ids stay under
30,522 because the random-weight folders carry all-MiniLM-L6-v2's tokenizer, which vLLM checks
ids against. vLLM runs from its own folder and environment (../shared/gpu/README.md) in
processes of its own; this script never imports it. Prints one JSON line per side, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from gpu_check import FUSED_KERNELS, SERVER_TIMES, documents, settle  # noqa: E402

from support import free_port  # noqa: E402

VOCAB = 30522
"""Token ids stay under the carried tokenizer's vocabulary (vLLM rejects larger ones)."""


WARM_LIMIT = 300
"""Seconds a side may refuse its warm-up batches with 429 before it is dropped."""


class Side:
    """A server process on a free port, its log, and the seconds it took to answer a query."""

    encoding = "base64"
    """The vectors' `encoding_format` (--encoding): base64, as the OpenAI SDK asks by default; JSON
    floats cost the client ~16 ms of parsing a 64 x 768 answer here, enough to bound a small model."""

    def __init__(self, name: str, command: list[str], port: int, log: Path, timeout: float) -> None:
        self.name, self.url, self.log = name, f"http://127.0.0.1:{port}", log
        began = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{log.read_text()[-4000:]}")
            if time.perf_counter() - began > timeout:
                self.stop()
                raise RuntimeError(f"{name} did not answer within {timeout} s:\n{log.read_text()[-4000:]}")
            try:
                if self.embed([[1000 + i for i in range(16)]]).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.first_answer = time.perf_counter() - began

    def embed(self, inputs: list[list[int]], session: requests.Session | None = None) -> requests.Response:
        body = {"input": inputs, "model": "m", "encoding_format": self.encoding}
        return (session or requests).post(f"{self.url}/v1/embeddings", json=body, timeout=600)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def gpu_idle(side: Side) -> float | None:
    """An ivy side's GPU idle share between steps since the previous call (its /info closes the
    engine's window and opens the next); None for other sides and on the CPU."""
    if not side.name.startswith("ivy"):
        return None
    return (requests.get(f"{side.url}/info", timeout=30).json().get("engine") or {}).get("gpu_idle_fraction")


def batch_rate(side: Side, docs: list[list[int]], client_batch: int, concurrency: int, warm: bool = False) -> float:
    """Tokens/s of the documents sent as client batches of `client_batch`, `concurrency` in flight.
    `warm`: a 429 is retried after its Retry-After for up to WARM_LIMIT seconds (a fresh machine's
    first steps compile kernels for a minute or more, and admission refuses what it cannot drain
    meanwhile); a side that still refuses then fails instead of holding up the others."""
    batches = [docs[i : i + client_batch] for i in range(0, len(docs), client_batch)]
    sessions = [requests.Session() for _ in range(concurrency)]
    deadline = time.perf_counter() + WARM_LIMIT

    def send(i: int) -> None:
        response = side.embed(batches[i], sessions[i % concurrency])
        while warm and response.status_code == 429 and time.perf_counter() < deadline:
            time.sleep(min(float(response.headers.get("retry-after", 1)), max(0.0, deadline - time.perf_counter())))
            response = side.embed(batches[i], sessions[i % concurrency])
        if not response.ok:  # the server's JSON error says why (a 429's: the drain it estimated)
            raise RuntimeError(f"{side.name} answered {response.status_code}: {response.text[:500]}")
        assert len(response.json()["data"]) == len(batches[i])

    began = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(send, range(len(batches))))
    return sum(map(len, docs)) / (time.perf_counter() - began)


def query_times(side: Side, count: int, rate: float, first: int = 0) -> list[tuple[float, dict[str, float]]]:
    """Milliseconds of `count` 16-token queries, one at a time, sent at `rate` a second (open
    loop), each with the server's split where it sends one; `first` varies the ids from one slice
    to the next."""
    session_pool = [requests.Session() for _ in range(8)]
    times: list[tuple[float, dict[str, float]]] = []

    def send(i: int) -> None:
        began = time.perf_counter()
        response = side.embed([[1000 + (i * 7 + j) % 20000 for j in range(16)]], session_pool[i % 8])
        elapsed = (time.perf_counter() - began) * 1000
        response.raise_for_status()
        split = {name: float(response.headers[f"x-{name}-time"]) for name in SERVER_TIMES
                 if f"x-{name}-time" in response.headers}  # fmt: skip
        times.append((elapsed, split))

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        for i in range(count):
            time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            pool.submit(send, first + i)
    return times


def query_latency(sides: list[Side], count: int, rate: float, slices: int) -> dict[str, dict]:
    """p50/p99 ms of each side's 16-token queries, and the medians of Ivy's split where it sends
    one: `count` a side, in `slices` slices alternating between the sides, so that drift falls on
    every side alike; a slice's first tenth is a warm-up."""
    times: dict[str, list[tuple[float, dict[str, float]]]] = {side.name: [] for side in sides}
    per = max(10, count // slices)
    for k in range(slices):
        for side in sides:
            times[side.name] += query_times(side, per, rate, k * per)[per // 10 :]
    latency = {}
    for name, answers in times.items():
        ms = [elapsed for elapsed, _ in answers]
        latency[name] = {"p50": round(float(np.percentile(ms, 50)), 3), "p99": round(float(np.percentile(ms, 99)), 3)}
        splits = [split for _, split in answers if split]
        if splits:  # the server's own medians: what the client's time holds beyond them is HTTP's
            latency[name]["server_p50"] = {part: round(statistics.median(s[part] for s in splits), 3)
                                           for part in SERVER_TIMES if part in splits[0]}  # fmt: skip
    return latency


def ivy_side(name: str, extra: str, model: Path, out: Path, home: Path | None = None) -> Side:
    """ivy-serve with `extra` flags; from the wheel installed in `home` (pip --target) if given."""
    port = free_port()
    serve = ["ivy-serve", "--model", str(model), "--hostname", "127.0.0.1", "--port", str(port),
             "--grpc-port", str(free_port()), *shlex.split(extra)]  # fmt: skip
    if home is not None:
        path = os.pathsep.join(filter(None, [str(home), os.environ.get("PYTHONPATH")]))
        serve = ["env", f"PYTHONPATH={path}", str(home / "bin" / "ivy-serve"), *serve[1:]]
    return Side(f"ivy {name}", serve, port, out / f"ivy-{name}.log", timeout=300)


def vllm_folder(model: Path, out: Path) -> Path:
    """The folder as vLLM takes a Qwen3-Embedding model: its architecture named as published
    (Qwen3ForCausalLM) and a tokenizer_config.json; the weights linked, not copied."""
    folder = out / "vllm-model"
    folder.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        target = folder / item.name
        if not target.exists() and item.name != "config.json":
            target.symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    if config.get("model_type") == "qwen3":
        config["architectures"] = ["Qwen3ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    if not (folder / "tokenizer_config.json").exists():
        (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def isolated(env: Path) -> str:
    """The shell prefix that gives vLLM its own environment: none of this process's Python path
    (the project's FlashInfer would be found and half-imported by vLLM's sampler), then env-vllm.sh."""
    return f"unset PYTHONPATH; export VLLM_USE_FLASHINFER_SAMPLER=0; source {shlex.quote(str(env))}"


def vllm_side(env: Path, folder: Path, memory: float, extra: str, out: Path) -> Side:
    port = free_port()
    serve = (f"{isolated(env)} && exec vllm serve {shlex.quote(str(folder))} --runner pooling "
             f"--dtype bfloat16 --host 127.0.0.1 --port {port} --gpu-memory-utilization {memory} "
             f"--served-model-name m {extra}")  # fmt: skip
    return Side("vllm serve", ["bash", "-c", serve], port, out / "vllm-serve.log", timeout=900)


VLLM_OFFLINE = """
import json, sys, time
from vllm import LLM
from vllm.inputs import TokensPrompt
docs = json.load(open(sys.argv[2]))
llm = LLM(model=sys.argv[1], runner="pooling", dtype="bfloat16", gpu_memory_utilization=float(sys.argv[3]),
          enable_prefix_caching=False)
prompts = [TokensPrompt(prompt_token_ids=d) for d in docs]
llm.embed(prompts, use_tqdm=False)
rates = []
for _ in range(int(sys.argv[4])):
    began = time.perf_counter()
    llm.embed(prompts, use_tqdm=False)
    rates.append(sum(map(len, docs)) / (time.perf_counter() - began))
print("RATES", json.dumps(rates))
"""


def vllm_offline(env: Path, folder: Path, docs: list[list[int]], memory: float, rounds: int, out: Path) -> list[float]:
    """vLLM's LLM.embed on the documents, in its own environment; tokens/s per round after a warm one."""
    (out / "docs.json").write_text(json.dumps(docs))
    (out / "vllm_offline.py").write_text(VLLM_OFFLINE)
    run = (f"{isolated(env)} && exec python3 {out / 'vllm_offline.py'} {folder} {out / 'docs.json'} "
           f"{memory} {rounds}")  # fmt: skip
    with (out / "vllm-offline.log").open("w") as log:
        subprocess.run(["bash", "-c", run], stdout=log, stderr=subprocess.STDOUT, timeout=900, check=False)
    lines = [line for line in (out / "vllm-offline.log").read_text().splitlines() if line.startswith("RATES ")]
    return json.loads(lines[-1][6:]) if lines else []


def transformers_rate(model: Path, docs: list[list[int]], rounds: int, batch: int = 64) -> list[float]:
    """Hugging Face transformers bf16 (sdpa), length-sorted batches padded to their longest."""
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    ordered = sorted(docs, key=len)
    batches = []
    for i in range(0, len(ordered), batch):
        part = ordered[i : i + batch]
        width = len(part[-1])
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for row, d in enumerate(part):
            ids[row, : len(d)], mask[row, : len(d)] = torch.tensor(d), 1
        batches.append((ids.cuda(), mask.cuda()))
    rates = []
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            torch.cuda.synchronize()
            began = time.perf_counter()
            for ids, mask in batches:
                net(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1].float().cpu()
            torch.cuda.synchronize()
            if round_:
                rates.append(sum(map(len, docs)) / (time.perf_counter() - began))
    del net
    torch.cuda.empty_cache()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--ivy", action="append", default=[], help="NAME=FLAGS: an ivy-serve side (repeatable)")
    parser.add_argument(
        "--ivy-from",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="run the ivy side NAME from the wheel installed in DIR (an earlier build)",
    )
    parser.add_argument("--vllm-env", type=Path, help="env-vllm.sh; without it, no vLLM sides")
    parser.add_argument("--vllm-memory", type=float, default=0.35, help="vLLM's --gpu-memory-utilization")
    parser.add_argument("--vllm-arg", default="", help="extra `vllm serve` flags")
    parser.add_argument("--no-offline", action="store_true", help="skip vLLM's LLM.embed")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rate", type=float, default=50, help="queries a second in the latency run")
    parser.add_argument("--starts", type=int, default=1, help="starts of each ivy side (first answer: median)")
    parser.add_argument("--query-slices", type=int, default=3, help="slices of the query run, alternating sides")
    parser.add_argument("--out", type=Path, default=Path("/tmp/peers"))
    parser.add_argument("--encoding", choices=("base64", "float"), default="base64", help="vectors' encoding_format")
    args = parser.parse_args()
    Side.encoding = args.encoding
    args.out.mkdir(parents=True, exist_ok=True)
    docs = documents(args.docs, VOCAB)
    print(f"{len(docs)} documents, {sum(map(len, docs))} tokens", flush=True)

    sides: list[Side] = []
    try:
        homes = {name: Path(home) for name, _, home in (spec.partition("=") for spec in args.ivy_from)}
        specs = [spec.partition("=")[::2] for spec in args.ivy or ["bf16="]]
        firsts: dict[str, list[float]] = {name: [] for name, _ in specs}
        for _ in range(args.starts - 1):  # extra starts, alternating, for the first answer's median
            for name, flags in specs:
                side = ivy_side(name, flags, args.model, args.out, homes.get(name))
                firsts[name].append(side.first_answer)
                side.stop()
        for name, flags in specs:
            sides.append(ivy_side(name, flags, args.model, args.out, homes.get(name)))
            sides[-1].first_answer = statistics.median([*firsts[name], sides[-1].first_answer])
        if args.vllm_env:
            sides.append(vllm_side(args.vllm_env, vllm_folder(args.model, args.out), args.vllm_memory, args.vllm_arg,
                                   args.out))  # fmt: skip
        for side in list(sides):  # warm: every bucket's eager run and capture, vLLM's compile
            try:
                batch_rate(side, docs, args.client_batch, args.concurrency, warm=True)
                if side.name.startswith("ivy"):  # its first long batch waited for the deferred imports
                    settle(side.url, lambda side=side: batch_rate(side, docs, args.client_batch, args.concurrency))
            except (requests.RequestException, RuntimeError) as why:  # the others are still measured
                print(f"{side.name} dropped: it failed its warm-up: {why}", flush=True)
                side.stop()
                sides.remove(side)
        rates: dict[str, list[float]] = {s.name: [] for s in sides}
        idle: dict[str, list[float]] = {s.name: [] for s in sides}
        for _ in range(args.rounds):  # alternating, so that drift falls on every side alike
            for side in sides:
                gpu_idle(side)  # opens the engine's idle-share window
                rates[side.name].append(batch_rate(side, docs, args.client_batch, args.concurrency))
                share = gpu_idle(side)
                if share is not None:
                    idle[side.name].append(share)
        latency = query_latency(sides, args.queries, args.rate, args.query_slices)
        results = []
        for side in sides:
            info = requests.get(f"{side.url}/info", timeout=30).json() if side.name.startswith("ivy") else {}
            fidelity = (info.get("engine") or {}).get("fidelity") or {}
            results.append({"side": side.name, "batch_tokens_s": round(statistics.median(rates[side.name])),
                            "batch_runs": [round(r) for r in rates[side.name]], "query_ms": latency[side.name],
                            "first_answer_s": round(side.first_answer, 2),
                            "worst_cosine": fidelity.get("worst_cosine"),
                            "worst_cosine_large": (fidelity.get("large_batches") or {}).get("worst_cosine"),
                            "fallbacks": fidelity.get("fallbacks"),
                            **{name: (info.get("engine") or {}).get(name) for name in FUSED_KERNELS},
                            "gpu_idle": statistics.median(idle[side.name]) if idle[side.name] else None})  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    finally:
        for side in sides:
            side.stop()
    if args.vllm_env and not args.no_offline:
        runs = vllm_offline(args.vllm_env, vllm_folder(args.model, args.out), docs, 0.8, args.rounds, args.out)
        if runs:
            results.append({"side": "vllm LLM.embed", "batch_tokens_s": round(statistics.median(runs)),
                            "batch_runs": [round(r) for r in runs]})  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    if not args.no_transformers:
        runs = transformers_rate(args.model, docs, args.rounds)
        results.append({"side": "transformers bf16", "batch_tokens_s": round(statistics.median(runs)),
                        "batch_runs": [round(r) for r in runs]})  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
    (args.out / "peers.json").write_text(json.dumps(results, indent=1))
    base = next((r["batch_tokens_s"] for r in results if r["side"] == "vllm serve"), None)
    print("| side | batch tokens/s | vs vllm serve | 16-token query p50 / p99 ms | the server's p50 ms |")
    print("|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['batch_tokens_s'] / base:.2f}x" if base else "-"
        q = r.get("query_ms") or {}
        latency = f"{q['p50']} / {q['p99']}" if q else "-"
        server = (q.get("server_p50") or {}).get("total", "-")
        print(f"| {r['side']} | {r['batch_tokens_s']:,} | {ratio} | {latency} | {server} |")
    shutil.rmtree(args.out / "vllm-model", ignore_errors=True)


if __name__ == "__main__":
    main()
