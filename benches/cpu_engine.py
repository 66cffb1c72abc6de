"""ROSE in-process against sentence-transformers' encode, same model, same texts, one run.

    python benches/cpu_engine.py [--docs 512] [--min-tokens 16] [--max-tokens 256] [--rounds 3]

ROSE runs twice: in float32 (the CPU default) and in its `mixed` dtype (bfloat16 matmuls,
float32 elsewhere). Prints tokens/s of each (median of the rounds, run alternately), the ratio
to sentence-transformers and the worst cosine against it, as a table for benches/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

import rose
from corpus import documents
from inprocess import encode, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--max-batch-tokens", type=int, default=4096, help="ROSE's batch budget (Tulip's default on the CPU)"
    )
    args = parser.parse_args()

    engines = {"rose float32": rose.Engine(device="cpu"), "rose mixed": rose.Engine(device="cpu", dtype="mixed")}
    st = SentenceTransformer(str(rose.default_model_path()), device="cpu")
    tok = tokenizer(engines["rose float32"])
    count = lambda text: len(tok.encode(text).ids)  # noqa: E731
    texts = documents(args.docs, args.min_tokens, args.max_tokens, count)
    tokens = sum(count(t) for t in texts)

    runs = {name: (lambda e=e: encode(e, texts, args.max_batch_tokens)) for name, e in engines.items()}
    runs["sentence-transformers"] = lambda: st.encode(texts)
    vectors = {name: run() for name, run in runs.items()}  # also the warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)

    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    peer = "sentence-transformers"
    print(
        f"{args.docs} docs of {args.min_tokens}-{args.max_tokens} tokens ({tokens} tokens), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}"
    )
    print(f"| engine | tokens/s | vs {peer} | worst cosine vs {peer} |")
    print("|---|---|---|---|")
    for name, r in rate.items():
        worst = (vectors[name] * vectors[peer]).sum(axis=1).min()
        print(f"| {name} | {r:,.0f} | {r / rate[peer]:.2f}x | {worst:.6f} |")


if __name__ == "__main__":
    main()
