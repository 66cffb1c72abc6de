"""An experiment on the GPU, not kept in ROSE: can the 16-token step's GEMMs read their weights
from L2? While the main stream computes, a side stream of the captured graph prefetches the next
GEMMs' weights (one `prefetch.global.L2` per 128-byte line, or `cp.async.bulk.prefetch.L2` per
16 KB); also cuBLASLt instead of cuBLAS, and the weights stored transposed (x @ W^T, "NN").
Qwen3-0.6B shape, lazy graphs; prints one row per variant.

    python benches/l2_prefetch.py MODEL_FOLDER   # a Qwen3-0.6B-shape folder (tests/models.py save_qwen3)
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import rose
from rose import layers
from rose.fidelity import cosines
from rose.graphs import CudaGraphs

sys.path.insert(0, str(Path(__file__).parent))
from latency import engine_latencies, gpu_milliseconds  # noqa: E402


@triton.jit
def _line_prefetch(ptr, n, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * 128
    offs = tl.minimum(offs, n - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];", "=r,l", [ptr + offs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _bulk_prefetch(ptr, n, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK
    size = tl.maximum(tl.minimum(n - offs, CHUNK).to(tl.int32), 16)
    offs = tl.minimum(offs, n - 16)
    asm = "cp.async.bulk.prefetch.L2.global [$1], $2;"
    tl.inline_asm_elementwise(asm, "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(weight: torch.Tensor, kind: str) -> None:
    data = weight.view(torch.uint8).view(-1)
    n = data.numel()
    if kind == "line":
        _line_prefetch[(triton.cdiv(n // 128, 1024),)](data, n, BLOCK=1024, num_warps=4)
    else:
        _bulk_prefetch[(triton.cdiv(triton.cdiv(n, 16384), 32),)](data, n, CHUNK=16384, BLOCK=32, num_warps=1)


ORIGINAL_CALL = layers.Linear.__call__
STATE: dict = {}


def patched_call(self, x):
    """Linear, with the prefetch of the GEMM `ahead` places later forked onto the side stream."""
    s = STATE
    if s.get("kind"):
        j = s["index"][id(self)]
        if j == 0:
            s["side"].wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s["side"]):
                for k in range(min(s["ahead"], len(s["order"]))):
                    prefetch(s["order"][k].weight, s["kind"])
        if j + s["ahead"] < len(s["order"]):
            s["side"].wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s["side"]):
                prefetch(s["order"][j + s["ahead"]].weight, s["kind"])
        if j == len(s["order"]) - 1:  # the last GEMM joins the side stream back
            out = x @ self.wt if s.get("nn") else F.linear(x, self.weight)
            torch.cuda.current_stream().wait_stream(s["side"])
            return out
    if s.get("nn"):
        return x @ self.wt
    return ORIGINAL_CALL(self, x)


def measure(engine: rose.Engine, label: str, base: np.ndarray | None = None) -> np.ndarray:
    engine.graphs = CudaGraphs("lazy", 256, engine.attention)  # captured again with the variant
    latency = engine_latencies(engine, 1, 16, 300)
    gpu = gpu_milliseconds(engine, 1, 16, 100)
    ids, cu = np.full(16, 1000, dtype=np.int32), np.array([0, 16], dtype=np.int32)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(300):
        lazy = engine.step(ids, cu)
    lazy.wait()
    pipelined = (time.perf_counter() - start) / 300 * 1000
    vector = engine.step(ids, cu).wait()
    cosine = "" if base is None else f"{float(cosines(vector, base)[0]):.6f}"
    p50, p99 = np.median(latency), np.percentile(latency, 99)
    print(f"| {label} | {p50:.3f} | {p99:.3f} | {np.median(gpu):.3f} | {pipelined:.3f} | {cosine} |", flush=True)
    return vector


def main() -> None:
    engine = rose.Engine(Path(sys.argv[1]), device="cuda")
    print(engine.attention.name, torch.cuda.get_device_name())
    order = [linear for layer in engine.model.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    STATE.update(order=order, index={id(linear): i for i, linear in enumerate(order)}, side=torch.cuda.Stream())
    layers.Linear.__call__ = patched_call
    print("| variant | engine 1x16 p50 ms | p99 | GPU ms p50 | pipelined ms/step | cosine to base |")
    print("|---|---|---|---|---|---|")
    base = measure(engine, "base (cuBLAS, TN)")
    measure(engine, "base again", base)
    for kind in ("line", "bulk"):
        for ahead in (1, 2, 3):
            STATE.update(kind=kind, ahead=ahead)
            measure(engine, f"prefetch {kind}, {ahead} ahead", base)
    STATE.update(kind=None)
    torch.backends.cuda.preferred_blas_library("cublaslt")
    measure(engine, "cuBLASLt", base)
    torch.backends.cuda.preferred_blas_library("cublas")
    for linear in order:
        linear.wt = linear.weight.t().contiguous()
    STATE.update(nn=True)
    measure(engine, "NN layout (x @ W^T stored)", base)
    STATE.update(kind="bulk", ahead=2)
    measure(engine, "NN + bulk prefetch 2 ahead", base)
    STATE.update(nn=False, kind=None)
    measure(engine, "base at the end", base)


if __name__ == "__main__":
    main()
