"""vLLM 0.22's FlashAttention builds (FA2, and FA3 with its own varlen scheduler) on
attention.py's ragged batches: the attention kernel a vLLM user runs, measured beside ROSE's
backends. Runs in vLLM's environment, never beside rose (their FlashInfer versions differ):

    (source .gpu-vllm/env-vllm.sh && python3 benches/attention_vllm.py --shapes "qwen3 d128 causal")

Each cell: median ms per call (TFLOP/s), and the largest difference from FA2's output.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from attention_batches import BATCHES, SHAPES, Shape, attention_flops, lengths, median_ms

# (column, FA version, the scheduler's metadata: None for none, else its pack_gqa)
VARIANTS = [("fa2", 2, None), ("fa3", 3, None), ("fa3 +scheduler", 3, False), ("fa3 +scheduler pack_gqa", 3, True)]


def row(shape: Shape, seqs: list[int], reps: int) -> list[str]:
    """One cell per variant over one batch."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    device = torch.device("cuda")
    cu = torch.tensor([0] + seqs, device=device).cumsum(0).to(torch.int32)
    longest, t = max(seqs), int(cu[-1])
    q = torch.randn(t, shape.num_heads, shape.head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(t, shape.num_kv_heads, shape.head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.tensor(seqs, device=device, dtype=torch.int32)

    def attend(version: int, metadata: torch.Tensor | None) -> torch.Tensor:
        return flash_attn_varlen_func(q, k, v, longest, cu, longest, cu_seqlens_k=cu, causal=shape.causal,
                                      fa_version=version, scheduler_metadata=metadata)  # fmt: skip

    reference, flops = attend(2, None).float(), attention_flops(shape, seqs)
    cells = []
    for _, version, pack_gqa in VARIANTS:
        metadata = None
        if pack_gqa is not None:
            metadata = get_scheduler_metadata(len(seqs), longest, longest, shape.num_heads, shape.num_kv_heads,
                                              shape.head_dim, seqlens, cu_seqlens_q=cu, causal=shape.causal,
                                              pack_gqa=pack_gqa)  # fmt: skip
        call = partial(attend, version, metadata)
        ms = median_ms(call, reps, device)
        gap = (call().float() - reference).abs().max().item()
        cells.append(f"{ms:.3f} ({flops / ms / 1e9:.0f}) d{gap:.0e}")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median ms per call (TFLOP/s) dMAX")
    print("| shape | batch | " + " | ".join(v[0] for v in VARIANTS) + " |")
    print("|---|---|" + "---|" * len(VARIANTS))
    for shape_name in args.shapes.split(","):
        for batch_name, bounds, tokens in BATCHES:
            seqs = lengths(bounds, tokens)
            cells = row(SHAPES[shape_name], seqs, args.reps)
            print(f"| {shape_name} | {len(seqs)} x {batch_name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
