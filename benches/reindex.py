"""Batch re-indexing: `ivy-embed` (in-process and against the server) beside the server's own
saturated throughput, on the same corpus, in one run.

    python benches/reindex.py                      # CPU, all-MiniLM-L6-v2, 2,000 documents
    python benches/reindex.py --device cuda --docs 50000

The three sides alternate in rounds (server, ivy-embed --server, ivy-embed in-process, ...) since
this machine's speed drifts; each figure is tokens/s of embedding (ivy-embed's own count, which
excludes its model load and includes reading the corpus and writing Parquet), and each ratio is
against the server's median. The server side is a client posting the corpus in length-sorted
batches of 256 documents, 16 in flight (as many tokens in flight as ivy-embed's 512 x 8), raw
bytes, to /v1/embeddings, after one pass over the whole corpus that captures the engine's
graphs; ivy-embed runs with its defaults, so its in-process engine starts cold each round.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from corpus import passages  # noqa: E402
from support import plain_tokenizer, start_server  # noqa: E402
from timing import http_batches  # noqa: E402


def server_rate(url: str, texts: list[str], batch: int, concurrency: int) -> float:
    """tokens/s of the server posting `texts` in length-sorted batches, `concurrency` in flight."""
    seconds, tokens = http_batches(url, sorted(texts, key=len, reverse=True), batch, concurrency)
    return tokens / seconds


def ivy_embed_rate(corpus: Path, out: Path, *flags: str) -> float:
    """tokens/s as ivy-embed reports it."""
    command = ["ivy-embed", str(corpus), "--output", str(out), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return float(re.findall(r"([\d.]+) tokens/s", done.stderr)[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", help="a model folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--min-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--embed-arg", action="append", default=[], help="extra ivy-embed flag (repeatable)")
    args = p.parse_args()

    import rose

    root = Path(args.model) if args.model else rose.default_model_path()
    tokenizer = plain_tokenizer(root)
    count = lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids)  # noqa: E731
    texts = passages(args.docs, args.min_tokens, args.max_tokens, count)
    tmp = Path(tempfile.mkdtemp(prefix="reindex-"))
    corpus = tmp / "corpus.jsonl.gz"
    with gzip.open(corpus, "wt") as f:
        f.writelines(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    model = ["--model", str(root)] if args.model else []
    server = start_server(tmp, "--device", args.device, *model)
    rates: dict[str, list[float]] = {"server": [], "ivy-embed --server": [], "ivy-embed in-process": []}
    try:
        server_rate(server.url, texts, 256, 16)  # warm-up
        for r in range(args.rounds):
            rates["server"].append(server_rate(server.url, texts, 256, 16))
            rates["ivy-embed --server"].append(
                ivy_embed_rate(corpus, tmp / f"http-{r}", "--server", server.url, *args.embed_arg)
            )
            engine = ["--device", args.device, *model, *args.embed_arg]
            rates["ivy-embed in-process"].append(ivy_embed_rate(corpus, tmp / f"local-{r}", *engine))
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    finally:
        server.stop()
    base = statistics.median(rates["server"])
    print(f"\n{args.docs} documents of {args.min_tokens}-{args.max_tokens} tokens, {args.device}, {args.rounds} rounds")
    print(f"{'side':<24}{'tokens/s (median)':>20}{'range':>24}{'vs server':>11}")
    for side, values in rates.items():
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        print(f"{side:<24}{statistics.median(values):>20,.0f}{spread:>24}{statistics.median(values) / base:>10.2f}x")


if __name__ == "__main__":
    main()
