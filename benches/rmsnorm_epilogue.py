"""Qwen3's MLP half-layer two ways (GPU): what ROSE runs (cuBLAS o with the residual add, ROSE's
RMSNorm, quack's gated GEMM, cuBLAS down with the add, RMSNorm again) against the deferred RMSNorm
of quack's epilogues: the o and down products add the residual, write it and h * gamma, and sum
squares per row (`gemm_rms`); the gate/up product applies the row's rstd before SwiGLU
(`rstd_swiglu_epi`), and the next QKV product would apply the down's. This is the second fusion
benches/RESULTS.md names for 650k tokens/s: it removes the RMSNorm kernels' passes over the
residual stream.

    python benches/rmsnorm_epilogue.py [--tokens 8192 16384] [--rounds 7]

Rounds alternate between the sides; medians. The check is the worst cosine per row of the
activation and of the next layer's input (h times rstd) against ROSE's path. Needs quack-kernels
0.6.5 (it comes with flash-attn-4).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fp8_speed import seconds

from rose.ops import kernels

HIDDEN, ATTENTION, INTERMEDIATE, EPS = 1024, 2048, 3072, 1e-6
"""Qwen3-0.6B's o (2,048 -> 1,024), gate/up (1,024 -> 2 x 3,072) and down products."""


def seeded_randn(generator: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Normal values times `scale` in bf16, drawn from `generator` on its device."""
    return (torch.randn(*shape, device=generator.device, generator=generator) * scale).bfloat16()


def sides(tokens: int, w: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, Callable[..., tuple]]:
    """ROSE's path and the deferred one on `tokens` random rows, each returning the activation and
    the next layer's input (the deferred one as h * gamma and the row's rstd)."""
    from quack.epilogue.library import rstd_swiglu_epi
    from quack.gemm_interface import gemm_gated, gemm_rms

    randn = functools.partial(seeded_randn, generator)

    attn, residual0 = randn(tokens, ATTENTION), randn(tokens, HIDDEN, scale=4.0)
    spare = [residual0.clone() for _ in range(3)]

    def rose(residual: torch.Tensor = spare[1]) -> tuple[torch.Tensor, torch.Tensor]:
        residual.addmm_(attn, w["o"].t())
        h = kernels.rmsnorm(residual, w["post_norm"], EPS)
        _, act = gemm_gated(h, w["gate_up"].t(), activation="swiglu", store_preact=False, tuned=False,
                            concat_layout=("B",))  # fmt: skip
        residual.addmm_(act, w["down"].t())
        return act, kernels.rmsnorm(residual, w["next_norm"], EPS)

    def deferred() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, rstd = gemm_rms(attn, w["o"].t(), C=residual0, norm_weight=w["post_norm"], premult_out=spare[0], eps=EPS,
                           tuned=False)  # fmt: skip
        act = rstd_swiglu_epi(h, w["gate_up"].t(), rstd=rstd, store_d=False, out_dtype=torch.bfloat16, tuned=False,
                              concat_layout=("B",))["postact"]  # fmt: skip
        h, rstd = gemm_rms(act, w["down"].t(), C=spare[0], norm_weight=w["next_norm"], premult_out=spare[2], eps=EPS,
                           tuned=False)  # fmt: skip
        return act, h, rstd

    def check() -> list[float]:
        """Worst cosine per row of the activation and the next input against ROSE's path."""
        act, h, rstd = deferred()
        want = rose(residual0.clone())  # ROSE's path updates the residual in place (timed on a spare)
        got = (act, h.float() * rstd[:, None])  # the next QKV product's epilogue applies rstd
        cosines = [F.cosine_similarity(a.float(), b.float(), dim=1).min() for a, b in zip(got, want, strict=True)]
        return [round(c.item(), 6) for c in cosines]

    return {"rose": rose, "deferred": deferred, "check": check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)

    randn = functools.partial(seeded_randn, generator)

    w = {
        "o": randn(HIDDEN, ATTENTION, scale=ATTENTION**-0.5),
        "gate_up": randn(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5),
        "down": randn(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5),
        "post_norm": 1 + 0.1 * randn(HIDDEN), "next_norm": 1 + 0.1 * randn(HIDDEN),
    }  # fmt: skip
    results = []
    print("| tokens | ROSE ms | deferred ms | speed-up | worst cosine (act, next input) |")
    print("|---|---|---|---|---|")
    for tokens in args.tokens:
        runs = sides(tokens, w, generator)
        worst = runs["check"]()
        times: dict[str, list[float]] = {"rose": [], "deferred": []}
        for _ in range(args.rounds):
            for name, ms in times.items():
                ms.append(seconds(runs[name]))
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        results.append({"tokens": tokens, "ms": ms, "worst_cosine": worst})
        print(f"| {tokens} | {ms['rose']:.3f} | {ms['deferred']:.3f} | {ms['rose'] / ms['deferred']:.2f}x | {worst} |")
    print(json.dumps({"rows": results, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
