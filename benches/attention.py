"""Attention backends on ragged batches of mixed lengths (H200): time per call of each backend,
for MiniLM's and Qwen3-0.6B's attention shapes, and the AUTO_TABLE it implies.

    python benches/attention.py [--reps 30]
"""

from __future__ import annotations

import argparse
import random

import torch

from rose.attention import BACKENDS, AttentionSpec, BackendUnavailable
from rose.batch import RaggedBatch

SHAPES = {
    "minilm d32": AttentionSpec(12, 12, 32, causal=False, dtype=torch.bfloat16),
    "qwen3 d128": AttentionSpec(16, 8, 128, causal=False, dtype=torch.bfloat16),
    "qwen3 d128 causal": AttentionSpec(16, 8, 128, causal=True, dtype=torch.bfloat16),
}
# (name, sequence length range, total tokens): queries, documents, long documents.
BATCHES = [("5-30", (5, 30), 4096), ("32-512", (32, 512), 16384), ("1k-4k", (1024, 4096), 32768)]


def lengths(bounds: tuple[int, int], tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < tokens:
        out.append(rng.randint(*bounds))
    return out


def attention_flops(spec: AttentionSpec, seqs: list[int]) -> float:
    full = sum(4 * n * n * spec.num_heads * spec.head_dim for n in seqs)
    return full / 2 if spec.causal else full


def time_backend(name: str, spec: AttentionSpec, seqs: list[int], reps: int) -> float | None:
    device = torch.device("cuda")
    try:
        backend = BACKENDS[name](spec, device)
    except BackendUnavailable:
        return None
    cu = torch.tensor([0] + seqs).cumsum(0).to(torch.int32)
    batch = RaggedBatch.from_host(torch.zeros(int(cu[-1]), dtype=torch.int32).numpy(), cu.numpy(), device)
    t = int(cu[-1])
    q = torch.randn(t, spec.num_heads, spec.head_dim, device=device, dtype=spec.dtype)
    k = torch.randn(t, spec.num_kv_heads, spec.head_dim, device=device, dtype=spec.dtype)
    v = torch.randn_like(k)
    backend.plan(batch)
    for _ in range(3):  # JIT and warm-up
        backend(q, k, v)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        backend(q, k, v)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--backends", default="fa2,fa3,fa4,torch")
    args = parser.parse_args()
    names = args.backends.split(",")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; median ms per call (TFLOP/s)")
    print("| shape | batch | " + " | ".join(names) + " | fastest |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for shape_name, spec in SHAPES.items():
        for batch_name, bounds, tokens in BATCHES:
            seqs = lengths(bounds, tokens)
            flops = attention_flops(spec, seqs)
            times = {n: time_backend(n, spec, seqs, args.reps) for n in names}
            cells = [f"{ms:.3f} ({flops / ms / 1e9:.0f})" if ms else "n/a" for ms in times.values()]
            fastest = min((ms, n) for n, ms in times.items() if ms)[1]
            print(f"| {shape_name} | {len(seqs)} x {batch_name} | " + " | ".join(cells) + f" | {fastest} |")


if __name__ == "__main__":
    main()
