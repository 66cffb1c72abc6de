"""A decoder's gate/up product and SwiGLU, two ways (GPU): cuBLAS's product then ROSE's
activation kernel (what ROSE runs unfused), against quack's gated GEMM with the activation in its
epilogue (rose.ops.fused_swiglu), over step sizes; the source of fused_swiglu.MIN_TOKENS.

    python benches/swiglu_gemm.py [--hidden 1024 --intermediate 3072] [--tokens 2048 8192 ...]

Each size: the two in alternating rounds, each round the mean of 50 back-to-back calls after 3
(fp8_speed.seconds); medians of the rounds. Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from fp8_speed import seconds

from rose.ops import kernels
from rose.ops.fused_swiglu import compile_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024, help="Qwen3-0.6B's by default")
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192, 10240, 12288, 14336, 16384, 32768])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shape = (2 * args.intermediate, args.hidden)
    began = time.perf_counter()
    fused = compile_for(shape, torch.bfloat16, torch.device("cuda"))
    print(f"import, compile and check: {time.perf_counter() - began:.1f} s")
    weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * args.hidden**-0.5
    rows = []
    print("| tokens | cuBLAS + activation ms | fused ms | speed-up | fused TFLOP/s |\n|---|---|---|---|---|")
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
        sides = {"unfused": lambda x=x: kernels.silu_and_mul(x @ weight.t()), "fused": lambda x=x: fused(x, weight)}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, run in sides.items():
                times[name].append(seconds(run))
        unfused, fast = (statistics.median(times[n]) * 1e3 for n in ("unfused", "fused"))
        tflops = 2 * tokens * shape[0] * shape[1] / (fast / 1e3) / 1e12
        rows.append({"tokens": tokens, "unfused_ms": round(unfused, 4), "fused_ms": round(fast, 4)})
        print(f"| {tokens} | {unfused:.3f} | {fast:.3f} | {unfused / fast:.2f}x | {tflops:.0f} |")
    print(json.dumps({"shape": shape, "rows": rows, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
