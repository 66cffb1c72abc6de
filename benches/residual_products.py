"""The products that add into the residual stream (GPU): Qwen3-0.6B's o (2,048 -> 1,024) and down
(3,072 -> 1,024) products with the residual added in the epilogue, as ROSE runs them (cuBLAS's
`addmm_` with beta 1), against quack's GEMM adding into its output under each configuration in
SWEEP. These narrow products (1,024 columns) run at 600-750 TFLOP/s in the step, where quack's
gated gate/up product runs at 745: this asks whether a quack GEMM would lift them, and whether it
drops the memset cuBLAS runs beside each.

    python benches/residual_products.py [--tokens 8192 16384] [--rounds 7]

Rounds alternate between the sides, each round the mean of 50 back-to-back calls
(fp8_speed.seconds); medians. The check is each quack side's relative error against cuBLAS on the
same residual. Needs quack-kernels 0.6.5 (it comes with flash-attn-4).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable

import torch
from fp8_speed import seconds
from qkv_epilogue import tile_name
from rmsnorm_epilogue import seeded_randn

HIDDEN = 1024
PRODUCTS = {"o": 2048, "down": 3072}
"""Qwen3-0.6B's products into the residual stream: name -> input width."""

SWEEP = [
    {"tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": True},
    {"tile_m": 128, "tile_n": 128, "cluster_m": 2, "cluster_n": 1, "pingpong": True},
    {"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1, "pingpong": False},
    {"tile_m": 192, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": True},
    {"tile_m": 256, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": False},
    {"tile_m": 256, "tile_n": 128, "cluster_m": 2, "cluster_n": 1, "pingpong": False},
    {"tile_m": 256, "tile_n": 256, "cluster_m": 1, "cluster_n": 1, "pingpong": False},
]
"""quack configurations whose tiles divide 1,024 columns (its pingpong kernels take at most 208)."""


def quack_sides() -> dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]]:
    """out += x @ weight.t() through quack, per configuration: quack's default (tuned=False) and
    each of SWEEP."""
    from quack.gemm_config import GemmConfig
    from quack.gemm_interface import gemm_add_inplace, gemm_tuned

    sides = {"quack default": lambda x, weight, out: gemm_add_inplace(x, weight.t(), out, tuned=False)}
    for tiles in SWEEP:
        config = GemmConfig(**tiles, is_dynamic_persistent=False)
        sides[tile_name(tiles)] = lambda x, weight, out, config=config: gemm_tuned.fn(
            x, weight.t(), out, None, add_to_output=True, config=config
        )
    return sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)

    randn = functools.partial(seeded_randn, generator)

    cublas = {"cuBLAS addmm_": lambda x, weight, out: out.addmm_(x, weight.t())}
    candidates = {**cublas, **quack_sides()}
    rows = []
    for product, width in PRODUCTS.items():
        weight = randn(HIDDEN, width, scale=width**-0.5)
        for tokens in args.tokens:
            x, residual = randn(tokens, width), randn(tokens, HIDDEN, scale=4.0)
            want = residual.float() + x.float() @ weight.float().t()
            sides, errors = dict(cublas), {}
            for name, run in candidates.items():
                out = residual.clone()
                try:
                    run(x, weight, out)
                except Exception as why:  # noqa: BLE001 - a configuration quack refuses is reported, not fatal
                    print(f"{product} {tokens} {name}: {type(why).__name__}: {str(why)[:200]}")
                    continue
                sides[name], errors[name] = run, float((out.float() - want).norm() / want.norm())
            out = residual.clone()  # accumulates over the timing calls; the values stay small
            times: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, run in sides.items():
                    times[name].append(seconds(functools.partial(run, x, weight, out)))
            flop = 2 * tokens * width * HIDDEN
            for name in sides:
                ms = statistics.median(times[name]) * 1e3
                rows.append({"product": product, "tokens": tokens, "side": name, "ms": round(ms, 4),
                             "tflops": round(flop / ms / 1e9, 1), "error": f"{errors[name]:.1e}"})  # fmt: skip
    print("| product | tokens | side | ms | TFLOP/s | relative error |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['product']} | {r['tokens']} | {r['side']} | {r['ms']:.4f} | {r['tflops']} | {r['error']} |")
    print(json.dumps({"rows": rows, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
