"""SwiGLU on the GPU: cuBLAS's gate/up product then the activation kernel, against one Triton GEMM
with the activation in its epilogue (rose.ops.triton_swiglu), for each candidate tile
configuration, at the Qwen3-0.6B shape (k 1,024, n 3,072) and a few token counts.

    python benches/swiglu_gemm.py --device cuda

Prints a Markdown table: ms a call (median of `--reps`), TFLOP/s of the two products, and the
fused path's ratio to the unfused one; and the fastest configuration a token count.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from rose.ops import kernels, triton_swiglu

CANDIDATES = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 5},
    {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 16, "num_warps": 8, "num_stages": 3},
]


def median_ms(work, reps: int) -> float:
    for _ in range(3):
        work()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    dtype, k, n = torch.bfloat16, args.hidden, args.intermediate
    weight = torch.randn(2 * n, k, device=args.device, dtype=dtype) / k**0.5
    print("| tokens | path | ms | TFLOP/s | vs unfused |\n|---|---|---|---|---|")
    best = {}
    for tokens in args.tokens:
        x = torch.randn(tokens, k, device=args.device, dtype=dtype)
        flops = 2 * tokens * k * 2 * n
        unfused = median_ms(lambda x=x: kernels.silu_and_mul(F.linear(x, weight)), args.reps)
        want = kernels.silu_and_mul(F.linear(x, weight)).float()
        print(f"| {tokens} | cuBLAS + silu_and_mul | {unfused:.4f} | {flops / unfused / 1e9:.0f} | 1.00x |")
        for config in CANDIDATES:
            try:
                got = triton_swiglu.swiglu_matmul(x, weight, config).float()
                ms = median_ms(lambda x=x, c=config: triton_swiglu.swiglu_matmul(x, weight, c), args.reps)
            except Exception as why:  # a configuration that does not fit this GPU's shared memory
                print(f"| {tokens} | {config} | failed: {type(why).__name__} | | |")
                continue
            error = float((got - want).abs().max() / want.abs().max())
            name = "/".join(str(v) for v in config.values())
            print(f"| {tokens} | triton {name} (error {error:.1e}) | {ms:.4f} | {flops / ms / 1e9:.0f} | "
                  f"{unfused / ms:.2f}x |")  # fmt: skip
            if ms < best.get(tokens, (float("inf"),))[0]:
                best[tokens] = (ms, unfused / ms, config)
    print(json.dumps({str(t): {"ms": b[0], "speedup": b[1], "config": b[2]} for t, b in best.items()}))


if __name__ == "__main__":
    main()
