"""What running the last layer past attention on the pooled rows alone saves (CLS and last-token
pooling, rose.models.pooling.pooled_forward), in-process: the engine as served against the same
engine computing every token's row to the end, alternating in short slices, the same documents
of 32-512 tokens; the worst cosine between the two sides' vectors.

    python benches/pooled_rows.py --shape bge-base --device cpu --docs 8 --slices 41
    python benches/pooled_rows.py --shape qwen3-0.6b --device cuda

bge-base: a random BertModel of its shape, CLS pooling; qwen3-0.6b: a random Qwen3-0.6B shape,
last-token pooling (its fused single-query decoder off, so both sides run the same layers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from gpu_check import documents
from step_breakdown import save_bert_base

import rose
from inprocess import embed_packed
from rose.models.pooling import pool
from timing import alternate, report

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import cosines, save_qwen3  # noqa: E402


def every_row(engine: rose.Engine) -> None:
    """Makes `engine` compute every token's row through the last layer, then pool."""
    engine._forward = lambda batch, attention: pool(engine.model.forward(batch, attention), batch, engine.pooling)


def query_p50(sides: dict[str, rose.Engine], slices: int, device: str) -> None:
    """One 16-token query's latency on each side, 200 a slice, slices alternating."""
    query = [list(range(1000, 1016))]
    times: dict[str, list[float]] = {name: [] for name in sides}
    for engine in sides.values():
        for _ in range(3):  # eager, capture, replay
            engine.embed_ids(query)
    for _ in range(slices):
        for name, engine in sides.items():
            for _ in range(200):
                began = time.perf_counter()
                engine.embed_ids(query)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - began)
    for name, t in times.items():
        print(f"{name}: one 16-token query p50 {statistics.median(t) * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("bge-base", "qwen3-0.6b"), default="bge-base")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--slices", type=int, default=7)
    parser.add_argument("--query", action="store_true", help="one 16-token query's p50 instead of batches")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp()) / args.shape
    if args.shape == "bge-base":
        save_bert_base(folder)
    else:
        save_qwen3(folder, "0.6b", bidirectional=False)
    make = lambda: rose.Engine(folder, device=args.device, verify=False, fused_decoder="off")  # noqa: E731
    sides = {"pooled rows": make(), "every row": make()}
    every_row(sides["every row"])
    if args.query:
        query_p50(sides, args.slices, args.device)
        return
    docs = documents(args.docs, 30522)
    tokens = sum(map(len, docs))
    vectors = [embed_packed(engine, docs) for engine in sides.values()]  # each bucket's eager run

    def timed(engine: rose.Engine) -> tuple[float, int]:
        began = time.perf_counter()
        embed_packed(engine, docs)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - began, tokens

    print(f"{args.shape}, {args.docs} documents ({tokens} tokens), {args.device}, {torch.get_num_threads()} threads")
    names = tuple(sides)
    report(*alternate(args.slices, lambda: timed(sides[names[0]]), lambda: timed(sides[names[1]]), names), names)
    print(f"worst cosine between them {cosines(*vectors).min():.6f}")


if __name__ == "__main__":
    main()
