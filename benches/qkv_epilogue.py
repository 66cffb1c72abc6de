"""Qwen3's QKV product with QK-norm and RoPE, two ways (GPU): cuBLAS's product then ROSE's Triton
qk_norm_rope (what ROSE runs), against quack's GEMM with the per-head RMSNorm and the rotation in
its epilogue, which saves the norm's pass over q and k (1.94 ms of a 16k-token Qwen3-0.6B step on
the H100, benches/RESULTS.md): the first of the fusions RESULTS names for 650k tokens/s, not yet
in ROSE.

    python benches/qkv_epilogue.py [--tokens 8192 16384] [--rounds 7]

Two quack forms, each checked against ROSE's path (worst cosine per head):
- `table`: quack's own `qk_rope_epi` on the q and k rows, cuBLAS for v (the cos/sin table,
  gathered per token once a step for every layer, is outside the timing);
- `posfreq`: one product over q, k and v whose epilogue computes the angles from each token's
  position; v passes through (norm weight 0 plus 1, zero frequency).
quack rotates adjacent column pairs where Qwen3 rotates halves (NeoX), so the q and k rows of the
weight are permuted per head (2j <- j, 2j+1 <- j + 64); attention's q.k is the same under any
permutation applied to both. Rounds alternate between the sides; medians. Needs quack-kernels
0.6.5 (it comes with flash-attn-4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fp8_speed import seconds

from rose.ops import kernels, triton_kernels

HIDDEN, HEADS, KV_HEADS, DIM, EPS = 1024, 16, 8, 128, 1e-6
"""Qwen3-0.6B's attention projection."""


def per_head(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """t's rows (or elements) reordered by `order` within each head of DIM."""
    return t.reshape(-1, DIM, *t.shape[1:])[:, order].reshape(t.shape).contiguous()


def posfreq_epilogue():  # noqa: ANN201 - quack's EpiMod
    """The `posfreq` form: per-head rstd times the norm weight (plus `keep`, 1 on v's columns),
    then RoPE from the row's position and each column's frequency (0 on v's columns)."""
    from quack.epilogue.frontend import gemm_epilogue, pack, unpack
    from quack.epilogue.head_rmsnorm import HeadRstd
    from quack.epilogue.ops import ColVecLoad, RowVecLoad
    from quack.epilogue.rotary import _angle_turns, _sincos_turns

    rstd = HeadRstd("qk", eps=1e-6)

    def squares(acc):  # noqa: ANN001, ANN202
        return {"qk": acc * acc}

    @gemm_epilogue(
        ops={"pos": ColVecLoad("pos"), "freq": RowVecLoad("freq"), "qk": rstd, "w": RowVecLoad("w"),
             "keep": RowVecLoad("keep")},
        prepass=squares,
        prepass_outs=("qk",),
        mode="acc_pair",
    )  # fmt: skip
    def qkv_norm_rope(acc, pos, freq, qk, w, keep):  # noqa: ANN001, ANN202
        x1, x2 = unpack(acc * (qk * w + keep))
        s, c = _sincos_turns(*_angle_turns(pos, freq))
        return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}

    return qkv_norm_rope


def sides(tokens: int, w: dict, generator: torch.Generator) -> dict[str, Callable[[], torch.Tensor]]:
    """ROSE's path and the two quack forms on `tokens` random rows, each returning q and k
    [tokens, (heads + kv_heads) * dim] (quack's in its pair order)."""
    from quack.epilogue.library import qk_rope_epi
    from quack.epilogue.rotary import make_interleaved_cos_sin

    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator)
    positions = torch.randint(0, 512, (tokens,), device="cuda", dtype=torch.int32, generator=generator)
    cache, half = w["cache"], DIM // 2
    cos_sin = make_interleaved_cos_sin(cache[positions.long(), :half], cache[positions.long(), half:])
    quack_args = {"out_dtype": torch.bfloat16, "tuned": False, "config": w["config"]}

    def rose() -> torch.Tensor:
        qkv = F.linear(x, w["weight"])
        q, k = triton_kernels.qk_norm_rope(qkv, w["q_norm"], w["k_norm"], EPS, positions, cache, HEADS, KV_HEADS)
        return torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1)], 1)

    def table() -> torch.Tensor:
        F.linear(x, w["v_weight"])
        return qk_rope_epi(x, w["qk_weight"].t(), cs=cos_sin, qk=DIM, w=w["norm"], **quack_args)["D"]

    def posfreq() -> torch.Tensor:
        out = w["posfreq"](x, w["all_weight"].t(), pos=positions.float(), freq=w["freq"], qk=DIM, w=w["norm_all"],
                           keep=w["keep"], **quack_args)["D"]  # fmt: skip
        return out[:, : w["qk_rows"]]

    return {"rose": rose, "table": table, "posfreq": posfreq}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--theta", type=float, default=1e6, help="Qwen3's rope_theta")
    args = parser.parse_args()
    from quack.epilogue.rotary import make_interleaved_inv_freq
    from quack.gemm_config import GemmConfig

    device = torch.device("cuda")
    qk_rows, rows = (HEADS + KV_HEADS) * DIM, (HEADS + 2 * KV_HEADS) * DIM
    generator = torch.Generator(device).manual_seed(0)
    weight = (torch.randn(rows, HIDDEN, device=device, generator=generator) * HIDDEN**-0.5).bfloat16()
    q_norm, k_norm = (1 + 0.1 * torch.randn(2, DIM, device=device, generator=generator)).bfloat16()
    pairs = torch.tensor([j // 2 + (j % 2) * (DIM // 2) for j in range(DIM)], device=device)
    norm = per_head(torch.cat([q_norm.repeat(HEADS), k_norm.repeat(KV_HEADS)]).float(), pairs)
    qk_weight, v_weight = per_head(weight[:qk_rows], pairs), weight[qk_rows:].contiguous()
    inv_freq = 1.0 / (args.theta ** (torch.arange(0, DIM, 2, dtype=torch.float64, device=device) / DIM))
    w = {
        "weight": weight, "q_norm": q_norm, "k_norm": k_norm, "qk_rows": qk_rows, "norm": norm,
        "qk_weight": qk_weight, "v_weight": v_weight, "all_weight": torch.cat([qk_weight, v_weight]),
        "norm_all": torch.cat([norm, torch.zeros(rows - qk_rows, device=device)]),
        "keep": torch.cat([torch.zeros(qk_rows, device=device), torch.ones(rows - qk_rows, device=device)]),
        "freq": make_interleaved_inv_freq(inv_freq, qk_rows, rows - qk_rows).float(),
        "cache": kernels.rope_cache(DIM, 32768, args.theta, device), "posfreq": posfreq_epilogue(),
        # quack's documented best config for these epilogues (192 x 128 tiles, clusters of 1 x 2, pingpong).
        "config": GemmConfig(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True,
                             is_dynamic_persistent=False),
    }  # fmt: skip
    results = []
    print("| tokens | cuBLAS + qk_norm_rope ms | table ms | posfreq ms | speed-up (best) | worst cosine |")
    print("|---|---|---|---|---|---|")
    for tokens in args.tokens:
        runs = sides(tokens, w, generator)
        began = time.perf_counter()
        want = runs["rose"]().float().reshape(-1, DIM)
        worst = {}
        for name in ("table", "posfreq"):  # back to halves, then a cosine per (token, head)
            got = per_head(runs[name]().float().t(), torch.argsort(pairs)).t().reshape(-1, DIM)
            worst[name] = round(F.cosine_similarity(got, want, dim=1).min().item(), 6)
        print(f"compile and check: {time.perf_counter() - began:.1f} s")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                times[name].append(seconds(run))
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        results.append({"tokens": tokens, "ms": ms, "worst_cosine": worst})
        speedup = ms["rose"] / min(ms["table"], ms["posfreq"])
        print(f"| {tokens} | {ms['rose']:.3f} | {ms['table']:.3f} | {ms['posfreq']:.3f} | {speedup:.2f}x | {worst} |")
    print(json.dumps({"rows": results, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
