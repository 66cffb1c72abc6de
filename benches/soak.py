"""Soak: a real ivy-serve under mixed load for a long while (queries, client batches, reranking
where the model scores, tokenize calls, and a few bad requests), with its resident memory, open
file descriptors and, on a GPU, device memory at the start and the end, and every answer's
status counted.

    python benches/soak.py --minutes 30                          # CPU, all-MiniLM-L6-v2
    python benches/soak.py --minutes 5 --device cuda --model DIR # the same on a GPU

"Start" is taken after a warm-up minute (caches, graphs and pools filled); memory is sampled
every 30 s, so a slow leak shows as a slope, not only as two numbers. Errors are answers other
than 200 to well-formed requests, and anything but the expected 4xx to the bad ones. Prints a
JSON line per sample and a summary.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from corpus import documents, queries  # noqa: E402
from support import Server, start_server  # noqa: E402


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the workers, when there are some)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [p for child in children for p in process_tree(int(child))]


def sample(server: Server, device: str) -> dict:
    """Resident MiB and open descriptors of the server's processes, GPU memory used (MiB)."""
    rss, fds = 0, 0
    for pid in process_tree(server.process.pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
            fds += len(list(Path(f"/proc/{pid}/fd").iterdir()))
        except (OSError, StopIteration):
            pass
    out = {"rss_mib": round(rss / 1024, 1), "open_fds": fds}
    if device.startswith("cuda"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True)  # fmt: skip
        out["gpu_mib"] = [int(v) for v in smi.stdout.split()] if smi.returncode == 0 else None
    return out


class Load:
    """Client threads of each kind, until stopped; counts statuses per kind."""

    def __init__(self, url: str, docs: list[str], words: list[str]) -> None:
        self.url, self.docs, self.words = url, docs, words
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def count(self, kind: str, ok: bool) -> None:
        with self.lock:
            self.counts[f"{kind} {'ok' if ok else 'error'}"] += 1

    def run(self, kind: str, seed: int) -> None:
        rng, session = random.Random(seed), requests.Session()
        while not self.stop.is_set():
            try:
                ok = getattr(self, kind)(rng, session)
            except requests.RequestException:
                ok = False
            self.count(kind, ok)

    def query(self, rng: random.Random, s: requests.Session) -> bool:
        body = {"input": " ".join(rng.sample(self.words, 8))}
        return s.post(f"{self.url}/v1/embeddings", json=body, timeout=60).status_code == 200

    def batch(self, rng: random.Random, s: requests.Session) -> bool:
        body = {"input": rng.sample(self.docs, 64)}
        return s.post(f"{self.url}/v1/embeddings", json=body, timeout=300).status_code == 200

    def tokenize(self, rng: random.Random, s: requests.Session) -> bool:
        body = {"inputs": rng.sample(self.docs, 4)}
        ok = s.post(f"{self.url}/tokenize", json=body, timeout=60).status_code == 200
        time.sleep(0.2)
        return ok

    def rerank(self, rng: random.Random, s: requests.Session) -> bool:
        body = {"query": " ".join(rng.sample(self.words, 6)), "texts": rng.sample(self.docs, 20)}
        return s.post(f"{self.url}/rerank", json=body, timeout=120).status_code == 200

    def bad(self, rng: random.Random, s: requests.Session) -> bool:
        """Malformed or refused requests: each must get its 4xx, and nothing else."""
        cases = [(b'{"input": ', 400), (json.dumps({"input": []}).encode(), 422),
                 (json.dumps({"input": "x", "dimensions": -3}).encode(), 422)]  # fmt: skip
        body, expected = rng.choice(cases)
        headers = {"content-type": "application/json"}
        answer = s.post(f"{self.url}/v1/embeddings", data=body, headers=headers, timeout=30)
        time.sleep(0.5)
        return answer.status_code == expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--warmup-minutes", type=float, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", help="model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--query-clients", type=int, default=4)
    parser.add_argument("--batch-clients", type=int, default=1)
    parser.add_argument("--server-arg", action="append", default=[])
    parser.add_argument("--rerank", action="store_true", help="the model scores: add /rerank clients")
    parser.add_argument("--out", type=Path, default=Path("/tmp/soak"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = ["--model", args.model] if args.model else []
    flags = ["--device", args.device, "--auto-truncate", *model, *args.server_arg]
    server = start_server(args.out, *flags, timeout=600)
    try:
        words_to_tokens = lambda text: len(text.split()) * 4 // 3  # noqa: E731 - near enough for sizes
        docs = documents(2000, 32, 256, words_to_tokens)
        words = [w for q in queries(500, 5, 30, words_to_tokens) for w in q.split()]
        load = Load(server.url, docs, words)
        kinds = ["query"] * args.query_clients + ["batch"] * args.batch_clients + ["tokenize", "bad"]
        kinds += ["rerank"] if args.rerank else []
        threads = [threading.Thread(target=load.run, args=(k, i), daemon=True) for i, k in enumerate(kinds)]
        for t in threads:
            t.start()
        time.sleep(args.warmup_minutes * 60)
        began = time.monotonic()
        samples = [{"t_s": 0, **sample(server, args.device), "answers": dict(load.counts)}]
        print(json.dumps(samples[-1]), flush=True)
        while time.monotonic() - began < args.minutes * 60:
            time.sleep(min(30, max(1.0, args.minutes * 60 - (time.monotonic() - began))))
            samples.append({"t_s": round(time.monotonic() - began), **sample(server, args.device),
                            "answers": dict(load.counts)})  # fmt: skip
            print(json.dumps(samples[-1]), flush=True)
        load.stop.set()
        for t in threads:
            t.join(timeout=300)
        alive = server.process.poll() is None
    finally:
        server.stop()
    errors = sum(v for k, v in load.counts.items() if k.endswith("error"))
    first, last = samples[0], samples[-1]
    summary = {"minutes": args.minutes, "device": args.device, "answers": dict(load.counts), "errors": errors,
               "server_alive_at_end": alive, "rss_mib": [first["rss_mib"], last["rss_mib"]],
               "open_fds": [first["open_fds"], last["open_fds"]],
               "gpu_mib": [first.get("gpu_mib"), last.get("gpu_mib")]}  # fmt: skip
    print(json.dumps(summary))
    (args.out / "soak.json").write_text(json.dumps({"samples": samples, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
