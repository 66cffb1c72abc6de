"""Qwen3's QKV product with QK-norm and RoPE, two ways (GPU): cuBLAS's product then ROSE's Triton
qk_norm_rope (the unfused path), against rose.ops.fused_qk_rope (quack's GEMM with the per-head
RMSNorm and the rotation in its epilogue), which saves the norm's pass over q and k. The source of
fused_qk_rope.TILES and MIN_TOKENS.

    python benches/qkv_epilogue.py [--tokens 4096 8192 16384] [--rounds 7] [--sweep]

`--sweep` times the fused product under each of the tile configurations in SWEEP. "product alone"
is cuBLAS's product with no epilogue and no norm: what the fused product would cost if its
epilogue were free. The check is the worst cosine per (token, head) of q and k, back in halves
order, against the unfused path. Rounds alternate between the sides; medians. Needs
quack-kernels 0.6.5 (it comes with flash-attn-4).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fp8_speed import seconds

from rose.ops import fused_qk_rope, kernels, triton_kernels
from rose.ops.fused_qk_rope import FusedQkv, QkvShape

QWEN3 = QkvShape(heads=16, kv_heads=8, head_dim=128, hidden=1024, eps=1e-6)
"""Qwen3-0.6B's attention projection."""

SWEEP = [
    {"tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": True},
    {"tile_m": 128, "tile_n": 128, "cluster_m": 2, "cluster_n": 1, "pingpong": True},
    {"tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 1, "pingpong": True},
    {"tile_m": 192, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": True},
    {"tile_m": 128, "tile_n": 256, "cluster_m": 1, "cluster_n": 1, "pingpong": False},
    {"tile_m": 256, "tile_n": 128, "cluster_m": 1, "cluster_n": 2, "pingpong": False},
]
"""quack configurations that fit the epilogue (a head's 128 columns within a tile)."""


def tile_name(tiles: dict[str, object]) -> str:
    """A quack configuration's short name in the tables: tiles, cluster, pp for pingpong."""
    return "{tile_m}x{tile_n} c{cluster_m}{cluster_n}{pp}".format(**tiles, pp=" pp" if tiles["pingpong"] else "")


def sides(tokens: int, fused: dict[str, FusedQkv], w: dict, generator: torch.Generator) -> dict[str, Callable]:
    """The unfused path and each fused product on `tokens` random rows."""
    x = torch.randn(tokens, QWEN3.hidden, device="cuda", dtype=torch.bfloat16, generator=generator)
    positions = torch.randint(0, 512, (tokens,), device="cuda", dtype=torch.int32, generator=generator)
    as_float = positions.float()

    def unfused() -> tuple[torch.Tensor, torch.Tensor]:
        qkv = F.linear(x, w["weight"])
        return triton_kernels.qk_norm_rope(qkv, w["q_norm"], w["k_norm"], QWEN3.eps, positions, w["cache"],
                                           QWEN3.heads, QWEN3.kv_heads)  # fmt: skip

    runs = {"unfused": unfused, "product alone": lambda: F.linear(x, w["weight"])}
    for name, product in fused.items():
        runs[name] = lambda product=product: product(0, x, as_float)
    return runs


def worst_cosine(unfused: tuple[torch.Tensor, torch.Tensor], fused: torch.Tensor) -> float:
    """The worst cosine per (token, head) of the fused product's q and k, back in halves order."""
    back = torch.argsort(fused_qk_rope.pair_order(QWEN3.head_dim)).cuda()
    got = fused[:, : QWEN3.qk_rows].unflatten(1, (-1, QWEN3.head_dim))[:, :, back].float()
    want = torch.cat(unfused, 1).float()
    return round(F.cosine_similarity(got, want, dim=-1).min().item(), 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sweep", action="store_true", help="every configuration in SWEEP, not only TILES")
    parser.add_argument("--theta", type=float, default=1e6, help="Qwen3's rope_theta")
    args = parser.parse_args()
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(0)
    weight = (torch.randn(QWEN3.rows, QWEN3.hidden, device=device, generator=generator) * QWEN3.hidden**-0.5).bfloat16()
    q_norm, k_norm = (1 + 0.1 * torch.randn(2, QWEN3.head_dim, device=device, generator=generator)).bfloat16()
    w = {"weight": weight, "q_norm": q_norm, "k_norm": k_norm,
         "cache": kernels.rope_cache(QWEN3.head_dim, 32768, args.theta, device)}  # fmt: skip
    inv_freq = kernels.rope_inv_freq(QWEN3.head_dim, args.theta)
    fused = {}
    for tiles in SWEEP if args.sweep else [fused_qk_rope.TILES]:
        name = tile_name(tiles)
        try:
            product = fused_qk_rope.compile_for(QWEN3, torch.bfloat16, device, tiles)
        except Exception as why:  # noqa: BLE001 - a configuration quack refuses is reported, not fatal
            print(f"{name}: {type(why).__name__}: {str(why)[:200]}")
            continue
        fused[name] = FusedQkv(product, QWEN3, inv_freq, [(weight, q_norm, k_norm)])
    results = []
    print(f"| tokens | unfused ms | product alone ms (TFLOP/s) | {' | '.join(f'{name} ms' for name in fused)} "
          "| speed-up (best) | worst cosine |")  # fmt: skip
    print(f"|---|---|---|{'---|' * len(fused)}---|---|")
    for tokens in args.tokens:
        runs = sides(tokens, fused, w, generator)
        unfused = runs["unfused"]()
        worst = min(worst_cosine(unfused, runs[name]()) for name in fused)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                times[name].append(seconds(run))
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        results.append({"tokens": tokens, "ms": ms, "worst_cosine": worst})
        best = min(ms[name] for name in fused)
        cells = " | ".join(f"{ms[name]:.3f}" for name in fused)
        alone = f"{ms['product alone']:.3f} ({2 * tokens * QWEN3.hidden * QWEN3.rows / ms['product alone'] / 1e9:.0f})"
        print(f"| {tokens} | {ms['unfused']:.3f} | {alone} | {cells} | {ms['unfused'] / best:.2f}x | {worst} |")
    print(json.dumps({"rows": results, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
