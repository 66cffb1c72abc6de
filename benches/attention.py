"""Attention backends on ragged batches of mixed lengths (H200): time per call of each backend,
and the host's time to plan the batch (on a lone request's path before its first launch), for
MiniLM's, the BERT-base family's (bge-base, bge-reranker-base) and Qwen3-0.6B's attention shapes,
and the AUTO_TABLE it implies.

    python benches/attention.py [--reps 30]
    python benches/attention.py --shapes "bert-base d64"                 # one shape (fewer JIT builds)
    python benches/attention.py --device cpu --backends sdpa --reps 2   # a dry run of the bench
    python benches/attention.py --shapes "qwen3 d128 causal" --backends fa3,cudnn   # cuDNN beside fa3

vLLM's own FlashAttention builds are measured on the same batches by attention_vllm.py.
"""

from __future__ import annotations

import argparse
import time

import torch
from attention_batches import BATCHES, SHAPES, attention_flops, lengths, median, median_ms

from rose.attention import BACKENDS, AttentionSpec, BackendUnavailable
from rose.batch import RaggedBatch


class CudnnPrefill:
    """cuDNN's ragged SDPA through FlashInfer's wrapper (`--backends fa3,cudnn`). Not one of ROSE's
    backends: measured beside them because cuDNN is one more library that attends over ragged
    batches with no padding."""

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        try:
            import cudnn  # noqa: F401  (FlashInfer's wrapper falls back to a cubin path without it)
            from flashinfer.cudnn import cudnn_batch_prefill_with_kv_cache
        except ImportError as error:
            raise BackendUnavailable(f"cudnn: {error}") from error
        self.run = cudnn_batch_prefill_with_kv_cache
        self.spec, self.workspace = spec, torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def plan(self, batch: RaggedBatch) -> None:
        self.batch = batch

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cu, longest = self.batch.cu_seqlens, self.batch.max_seqlen
        return self.run(q, k, v, self.spec.scale, self.workspace, max_token_per_sequence=longest,
                        max_sequence_kv=longest, causal=self.spec.causal, return_lse=False, batch_offsets_q=cu,
                        batch_offsets_k=cu, batch_offsets_units="tokens")[0]  # fmt: skip


def time_backend(name: str, spec: AttentionSpec, seqs: list[int], reps: int, device: torch.device
                 ) -> tuple[float, float] | None:  # fmt: skip
    """Median ms of one call over the batch (CUDA events; the wall clock on the CPU), and median
    microseconds of the host's plan; None where the backend does not load here."""
    try:
        backend = (CudnnPrefill if name == "cudnn" else BACKENDS[name])(spec, device)
    except BackendUnavailable:
        return None
    cu = torch.tensor([0] + seqs).cumsum(0).to(torch.int32)
    batch = RaggedBatch.from_host(torch.zeros(int(cu[-1]), dtype=torch.int32).numpy(), cu.numpy(), device)
    t = int(cu[-1])
    q = torch.randn(t, spec.num_heads, spec.head_dim, device=device, dtype=spec.dtype)
    k = torch.randn(t, spec.num_kv_heads, spec.head_dim, device=device, dtype=spec.dtype)
    v = torch.randn_like(k)
    plans = []
    for _ in range(reps + 3):  # the first plans load modules
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        backend.plan(batch)
        plans.append(time.perf_counter() - begin)
    return median_ms(lambda: backend(q, k, v), reps, device), median(plans[3:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--backends", default="fa2,fa3,fa4,torch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of: " + ", ".join(SHAPES))
    args = parser.parse_args()
    names = args.backends.split(",")
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}; median ms per call (TFLOP/s) +host plan us")
    print("| shape | batch | " + " | ".join(names) + " | fastest | with its plan |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        spec = AttentionSpec(*shape, dtype=torch.bfloat16)
        for batch_name, bounds, tokens in BATCHES:
            seqs = lengths(bounds, tokens)
            flops = attention_flops(shape, seqs)
            timed = {n: time_backend(n, spec, seqs, args.reps, device) for n in names}
            cells = [f"{ms:.3f} ({flops / ms / 1e9:.0f}) +{plan:.0f}us" if ms else "n/a"
                     for ms, plan in (t or (0, 0) for t in timed.values())]  # fmt: skip
            loaded = {n: t for n, t in timed.items() if t}
            fastest = min(loaded, key=lambda n: loaded[n][0])
            # A lone request waits for both: the host plans before it launches. At saturation the
            # plan overlaps the step before, so the kernel's time alone picks the table's entry.
            alone = min(loaded, key=lambda n: loaded[n][0] + loaded[n][1] / 1e3)
            row = [shape_name, f"{len(seqs)} x {batch_name}", *cells, fastest, alone]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
