"""Where a saturated engine step's time goes (GPU): the kernels of a few steps of ~16k tokens of
mixed 32-512-token documents, from torch.profiler, grouped into matrix products, attention,
norms/activations/RoPE, FP8 quantization, pooling and copies, and the host's gaps between
kernels, each beside its floor: FLOPs at the measured bf16 (or FP8) GEMM peak, bytes at the
measured copy bandwidth.

    python benches/step_breakdown.py --device cuda                     # Qwen3-0.6B shape
    python benches/step_breakdown.py --device cuda --bert-base         # bge-base: 12 x 768
    python benches/step_breakdown.py --device cuda --dtype fp8

Steps run eagerly (graphs off) so that the profiler sees each kernel; the same steps' wall time
under CUDA graphs is printed beside, so the launch cost graphs remove shows too, and under graphs
with the matmuls' epilogue fusions off (rose.ops.kernels.FUSED_EPILOGUES) and with quack's alone
off (`fused_swiglu="off"`, `fused_qk_rope="off"`), what they save. Prints a Markdown table and a
JSON line; `--kernels N` adds the N costliest kernels and each matmul shape's TFLOP/s, to tell
which product lags.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import rose
from rose.ops import kernels

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from fp8_speed import packed, seconds  # noqa: E402
from gpu_check import documents  # noqa: E402

from support import save_qwen3  # noqa: E402

GROUPS = (
    ("fp8 quantization", ("quantize_rows",)),
    ("attention", ("flash", "fmha", "attention", "prefill", "attn")),
    ("matrix products", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "scaled_mm", "wgmma", "sm90_")),
    ("norms, activations, RoPE", ("norm", "rope", "silu", "gelu", "act_and_mul", "tanh", "erf")),
    ("pooling and copies", ("memcpy", "copy", "index", "gather", "pool", "cat", "fill", "scatter")),
)
"""Kernel-name patterns, checked in this order (FA3's kernels' names hold "sm90" too)."""


def group(name: str) -> str:
    lowered = name.lower()
    return next((g for g, patterns in GROUPS if any(p in lowered for p in patterns)), "other elementwise")


def save_bert_base(folder: Path) -> Path:
    """A random BertModel of bge-base-en's shape (12 layers, 768 wide, CLS pooling)."""
    from transformers import BertConfig, BertModel

    from support import _finish

    torch.manual_seed(1)
    config = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    folder.mkdir(parents=True, exist_ok=True)
    _finish(folder, BertModel(config).eval(), "cls", "", {})
    return folder


def measured_peaks() -> dict[str, float]:
    """bf16 and FP8 GEMM TFLOP/s at 8192^3, and a device-to-device copy's GB/s (read + write)."""
    from rose.ops import fp8

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    qa, sa = fp8.quantize_rows(a)
    qb, sb = fp8.quantize_weight(a)
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(big)

    def rate(work: Callable[[], object], amount: float) -> float:
        return amount / seconds(work, rounds=20)

    flops = 2 * 8192**3
    return {
        "bf16_tflops": rate(lambda: a @ a, flops) / 1e12,
        "fp8_tflops": rate(lambda: fp8.scaled_mm(qa, sa, qb, sb, None, torch.bfloat16), flops) / 1e12,
        "copy_gbs": rate(lambda: out.copy_(big), 2 * big.numel()) / 1e9,
    }


def floors(
    config: dict, steps: list[list[list[int]]], peaks: dict[str, float], fp8_matmuls: bool, fused: set[str]
) -> dict[str, float]:  # fmt: skip
    """Milliseconds a step each part needs at least: matmul and attention FLOPs at the GEMM peak;
    the elementwise kernels' bytes (norms with their residual adds, the activation unless the
    gate/up product applies it, RoPE unless the QKV product applies it with QK-norm; `fused` names
    the quack kernels in use; 2-byte values read and written once each) at the copy bandwidth."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    gated = config.get("model_type") in ("qwen3", "qwen2", "llama", "mistral")
    params = hidden * (heads + 2 * kv) * head_dim + heads * head_dim * hidden + hidden * inter * (3 if gated else 2)
    tokens = sum(len(s) for step in steps for s in step) / len(steps)
    squares = sum(len(s) ** 2 for step in steps for s in step) / len(steps)
    causal = 0.5 if gated else 1.0
    peak = (peaks["fp8_tflops"] if fp8_matmuls else peaks["bf16_tflops"]) * 1e12
    activation = 0 if gated and "fused SwiGLU" in fused else (6 if gated else 4) * inter
    rope = 0 if "fused QK-norm and RoPE" in fused else (heads + kv) * head_dim * 4
    elementwise = tokens * layers * (2 * hidden * 8 + activation + rope)
    return {
        "matrix products": 2 * tokens * params * layers / peak * 1e3,
        "attention": 4 * squares * heads * head_dim * layers * causal / (peaks["bf16_tflops"] * 1e12) * 1e3,
        "norms, activations, RoPE": elementwise / (peaks["copy_gbs"] * 1e9) * 1e3,
        "tokens_per_step": tokens,
    }


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::_addmm_activation")


def matmul_rates(prof: profile, steps: int) -> list[dict]:
    """Each matmul op and input shape's ms a step and TFLOP/s, from a profile with shapes."""
    out = []
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key not in MATMUL_OPS or not event.self_device_time_total:
            continue
        shapes = [s for s in event.input_shapes if len(s) == 2]
        (m, k), (_, n) = shapes[-2], shapes[-1]  # addmm's C comes first
        seconds_ = event.self_device_time_total / 1e6
        out.append({"op": event.key, "m": m, "k": k, "n": n, "calls": event.count // steps,
                    "ms": round(seconds_ * 1e3 / steps, 3),
                    "tflops": round(2 * m * k * n * event.count / seconds_ / 1e12, 1)})  # fmt: skip
    return sorted(out, key=lambda r: -r["ms"])


def grouped(prof: profile, steps: int) -> dict[str, float]:
    """Milliseconds a step each group's kernels and copies ran (the host's API calls have none)."""
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            out[group(event.key)] = out.get(group(event.key), 0.0) + event.self_device_time_total / 1e3 / steps
    return out


def print_costliest(prof: profile, steps: int, count: int, run: str) -> None:
    """The `count` kernels (and copies) that ran longest, as a Markdown table: calls and ms a step."""
    events = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0),
                    key=lambda e: -e.self_device_time_total)[:count]  # fmt: skip
    print(f"| kernel ({run}) | calls a step | ms a step |\n|---|---|---|")
    for e in events:
        print(f"| {e.key[:110]} | {e.count / steps:.0f} | {e.self_device_time_total / 1e3 / steps:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bert-base", action="store_true", help="the bge-base shape instead of Qwen3-0.6B")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--kernels", type=int, default=0, help="list the N costliest kernels and the matmuls' rates")
    args = parser.parse_args()
    folder = args.model
    if folder is None and args.bert_base:
        folder = save_bert_base(Path(tempfile.mkdtemp()) / "bert-base")
    elif folder is None:
        folder = Path(tempfile.gettempdir()) / "gpu-check-qwen3-0.6b"
        if not (folder / "config.json").exists():
            save_qwen3(folder, "0.6b", bidirectional=False)
    config = json.loads((folder / "config.json").read_text())
    docs = documents(args.docs, min(30522, config["vocab_size"]))
    steps = packed(docs, 16384)[:-1]  # full steps only
    peaks = measured_peaks()
    timed = {}
    # The last engine is the profiled one: graphs off, epilogues fused as served.
    # (With the epilogues off the fused SwiGLU cannot apply, so that run does not load it.)
    runs = (("unfused", "lazy", False, "off"), ("quack unfused", "lazy", True, "off"), ("lazy", "lazy", True, "auto"),
            ("off", "off", True, "auto"))  # fmt: skip
    for name, graphs, fused, quack in runs:
        kernels.FUSED_EPILOGUES = fused
        engine = rose.Engine(folder, device=args.device, dtype=args.dtype, cuda_graphs=graphs, verify=False,
                             fused_swiglu=quack, fused_qk_rope=quack)  # fmt: skip
        for kernel in (engine.swiglu, engine.qk_rope):
            kernel.wait()  # loaded before the steps, as a server has them after its first large ones
        if name == "lazy":
            graphed = engine
        for _ in range(2):
            engine.embed_batches(steps)
        torch.cuda.synchronize()
        began = time.perf_counter()
        engine.embed_batches(steps)
        timed[name] = (time.perf_counter() - began) / len(steps) * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the eager engine: graphs off
        engine.embed_batches(steps)
        torch.cuda.synchronize()
    if args.kernels:
        print_costliest(prof, len(steps), args.kernels, "eager")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as shaped:
            engine.embed_batches(steps)
            torch.cuda.synchronize()
        for row in matmul_rates(shaped, len(steps)):
            print(json.dumps(row))
        # The same steps replayed from their graphs: which kernels a replay runs longer or adds.
        with profile(activities=[ProfilerActivity.CUDA]) as replayed:
            graphed.embed_batches(steps)
            torch.cuda.synchronize()
        print(json.dumps({"under graphs": grouped(replayed, len(steps))}))
        print_costliest(replayed, len(steps), args.kernels, "graphs")
    kernel_ms = grouped(prof, len(steps))
    quack = {k.name: k.state for k in (engine.swiglu, engine.qk_rope)}
    ready = {name for name, state in quack.items() if state == "ready"}
    floor = floors(config, steps, peaks, args.dtype == "fp8", ready)
    busy = sum(kernel_ms.values())
    rows = dict(sorted(kernel_ms.items(), key=lambda kv: -kv[1]))
    rows["host gaps (eager)"] = max(0.0, timed["off"] - busy)
    rows["host gaps (graphs)"] = max(0.0, timed["lazy"] - busy)
    print(f"{floor['tokens_per_step']:.0f} tokens a step; step {timed['lazy']:.2f} ms under graphs, "
          f"{timed['off']:.2f} ms eager, {timed['unfused']:.2f} ms under graphs with the epilogues unfused, "
          f"{timed['quack unfused']:.2f} with quack's kernels alone off ({quack}); "
          f"peaks {json.dumps({k: round(v, 1) for k, v in peaks.items()})}")  # fmt: skip
    print("| part | ms a step | share | floor ms |\n|---|---|---|---|")
    for name, ms in rows.items():
        bound = floor.get(name)
        print(f"| {name} | {ms:.2f} | {ms / timed['lazy']:.0%} | {'-' if bound is None else f'{bound:.2f}'} |")
    print(json.dumps({"model": config.get("model_type"), "dtype": args.dtype, "step_ms": timed, "parts_ms": rows,
                      "floors_ms": floor, "peaks": peaks}))  # fmt: skip


if __name__ == "__main__":
    main()
