"""The GEMMs of a 16-token query, cuBLAS against rose.small_batch's Triton kernel, on the GPU.

    python benches/skinny.py [--tokens 16] [--layers 28]

For each dense layer of the Qwen3-0.6B shape, a chain of `--layers` GEMMs on distinct weights
(so that no weight is read from L2) is captured in one CUDA graph and replayed; the table gives
microseconds a GEMM and the weight bytes read per second. The Triton kernel runs in each block
configuration of the sweep, with and without programmatic dependent launch; the best one a shape
belongs in rose.small_batch.CONFIGS.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from rose import small_batch

# (name, N, K, parts): parts = 2 for the gate and up projections run as one kernel.
SHAPES = [("qkv", 4096, 1024, 1), ("o", 1024, 2048, 1), ("gate_up", 3072, 1024, 2), ("down", 1024, 3072, 1)]
SWEEP = dict(BLOCK_N=[16, 32, 64], BLOCK_K=[128, 256], num_warps=[4], num_stages=[4])


def graphed_microseconds(run, layers: int, replays: int = 20) -> float:
    """Microseconds a call of run(i) takes inside one CUDA graph of `layers` calls."""
    for i in range(layers):  # compile outside the capture
        run(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(layers):
            run(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / replays / layers


def bench_shape(name: str, n: int, k: int, parts: int, tokens: int, layers: int) -> dict:
    """Prints cuBLAS's row and the three fastest Triton configurations; returns the fastest."""
    weights = [torch.randn(n * parts, k, device="cuda", dtype=torch.bfloat16) / 32 for _ in range(layers)]
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    norm = torch.ones(k, device="cuda", dtype=torch.bfloat16)
    residual = torch.zeros(tokens, n, device="cuda", dtype=torch.bfloat16)
    megabytes = weights[0].numel() * 2 / 1e6

    def row(kernel: str, config: str, us: float) -> None:
        print(f"| {name} | {n * parts} x {k} | {kernel} | {config} | {us:.2f} | {megabytes / us:.2f} |", flush=True)

    def fused(i: int) -> torch.Tensor:
        if name == "gate_up":
            return small_batch.norm_linear_silu_and_mul(x, norm, 1e-6, weights[i])
        if name == "qkv":
            return small_batch.norm_linear(x, norm, 1e-6, weights[i])
        return small_batch.linear_add(x, weights[i], residual)

    row("cuBLAS (F.linear)", "", graphed_microseconds(lambda i: F.linear(x, weights[i]), layers))
    results = []
    for values in itertools.product(*SWEEP.values()):
        config = dict(zip(SWEEP, values, strict=True))
        if n % config["BLOCK_N"] or k % config["BLOCK_K"]:
            continue
        small_batch.CONFIGS[(n, k)] = config
        for pdl in (False, True):
            small_batch.ENABLE_PDL = pdl
            small_batch._pdl.cache_clear()
            try:
                results.append((graphed_microseconds(fused, layers), pdl, config))
            except Exception as error:  # a configuration that does not compile (shared memory)
                print(f"<!-- {config}: {type(error).__name__} -->")
    results.sort(key=lambda r: r[0])
    for us, pdl, config in results[:3]:
        row("Triton" + (" + PDL" if pdl else ""), " ".join(f"{a}={b}" for a, b in config.items()), us)
    return results[0][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--layers", type=int, default=28)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, {args.tokens} tokens, chains of {args.layers} weights, bf16")
    print("| layer | N x K | kernel | config | us a GEMM | TB/s |")
    print("|---|---|---|---|---|---|")
    best = {(n, k): bench_shape(name, n, k, parts, args.tokens, args.layers) for name, n, k, parts in SHAPES}
    print("\nrose.small_batch.CONFIGS =", best)


if __name__ == "__main__":
    main()
