"""`--dtype fp8` against bfloat16 in the engine (GPU): tokens/s on mixed 32-512-token documents in
alternating slices, the fidelity against float32 on the start-up check's sequences and on a
held-out set, and the matmuls alone (bf16 against FP8 GEMMs at the model's shapes), so that the
figure can be read against its ceiling.

    python benches/fp8_speed.py --device cuda                         # Qwen3-0.6B shape, random weights
    python benches/fp8_speed.py --device cuda --model DIR             # a folder (a reranker: its scores)
    python benches/fp8_speed.py --device cuda --shape bge-reranker-base

The FP8 engine here skips the start-up check (verify=False) to measure the path itself; a server
serves FP8 only where the check holds. Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import rose
from rose.ops import fp8
from rose.serving import fidelity

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from gpu_check import documents  # noqa: E402

from support import save_qwen3  # noqa: E402


def tokens_per_second(engine: rose.Engine, batches: list[list[list[int]]]) -> float:
    tokens = sum(len(s) for b in batches for s in b)
    began = time.perf_counter()
    engine.embed_batches(batches)
    return tokens / (time.perf_counter() - began)


def packed(docs: list[list[int]], budget: int) -> list[list[list[int]]]:
    """The documents in steps of up to `budget` tokens, in order (as Tulip packs them)."""
    out, step, used = [], [], 0
    for d in docs:
        if step and used + len(d) > budget:
            out.append(step)
            step, used = [], 0
        step.append(d)
        used += len(d)
    return out + ([step] if step else [])


def gemm_rates(shapes: list[tuple[int, int]], tokens: int) -> dict[str, float]:
    """TFLOP/s of the model's matmuls at `tokens` rows, bf16 and FP8 (with the quantization of
    the activations, as the engine runs them, and without)."""
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for n, k in shapes]
    inputs = [torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16) for _, k in shapes]
    quantized = [fp8.quantize_weight(w) for w in weights]
    ready = [fp8.quantize_rows(x) for x in inputs]

    def bf16() -> None:
        for x, w in zip(inputs, weights, strict=True):
            torch.nn.functional.linear(x, w)

    def fp8_only() -> None:
        for (q, s), (wq, ws) in zip(ready, quantized, strict=True):
            fp8.scaled_mm(q, s, wq, ws, None, torch.bfloat16)

    def fp8_quantizing() -> None:
        for x, (wq, ws) in zip(inputs, quantized, strict=True):
            fp8.scaled_mm(*fp8.quantize_rows(x), wq, ws, None, torch.bfloat16)

    flops = 2 * tokens * sum(n * k for n, k in shapes)
    runs = {"bf16": bf16, "fp8": fp8_only, "fp8 with quantization": fp8_quantizing}
    return {name: round(flops / seconds(run) / 1e12, 1) for name, run in runs.items()}


def seconds(run: Callable[[], None], rounds: int = 50) -> float:
    """GPU seconds of one call of `run`, after a warm-up."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(rounds):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model folder (default: a random Qwen3-0.6B shape)")
    parser.add_argument("--shape", help="a benches/rerank.py shape instead (random weights)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--docs", type=int, default=1536)
    parser.add_argument("--held-out", type=int, default=256)
    parser.add_argument("--slices", type=int, default=5)
    args = parser.parse_args()
    folder = args.model
    if args.shape:
        from rerank import save

        folder = save(args.shape, Path(tempfile.gettempdir()) / f"fp8-{args.shape}")
    elif folder is None:
        folder = Path(tempfile.gettempdir()) / "gpu-check-qwen3-0.6b"
        if not (folder / "config.json").exists():
            save_qwen3(folder, "0.6b", bidirectional=False)
    vocab = min(30522, json.loads((folder / "config.json").read_text())["vocab_size"])
    docs = documents(args.docs, vocab)
    held_out = documents(args.held_out, vocab, seed=99)

    reference = rose.Engine(folder, device=args.device, dtype="float32", attention_backend="sdpa", verify=False)
    expected_states = reference.embed_batches(packed(held_out, 16384), states=True)
    del reference
    torch.cuda.empty_cache()
    engines = {"bf16": rose.Engine(folder, device=args.device, dtype="bfloat16"),
               "fp8": rose.Engine(folder, device=args.device, dtype="fp8", verify=False)}  # fmt: skip
    steps = packed(docs, engines["bf16"].max_batch_tokens)
    for engine in engines.values():  # every bucket's eager run, then its capture
        tokens_per_second(engine, steps)
        tokens_per_second(engine, steps)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.slices):
        for name, engine in engines.items():
            rates[name].append(tokens_per_second(engine, steps))
    for name, engine in engines.items():
        states = engine.embed_batches(packed(held_out, 16384), states=True)
        cos = fidelity.cosines(states, expected_states)
        row = {"side": name, "tokens_s": round(statistics.median(rates[name])),
               "runs": [round(r) for r in rates[name]], "held_out_worst_cosine": round(float(cos.min()), 6),
               "held_out_median_cosine": round(float(np.median(cos)), 6)}  # fmt: skip
        if engine.state_scores is not None:  # the head on the states: probabilities, as /rerank reports them
            scores, expected = engine.state_scores(states)[:, 0], engine.state_scores(expected_states)[:, 0]
            row["score_max_abs_diff"] = round(float(np.abs(scores - expected).max()), 5)
            order, want = np.argsort(-scores), np.argsort(-expected)
            ties = np.abs(expected[order] - expected[want]) <= fidelity.SCORE_BOUND
            row["order_kept_up_to_ties"] = bool(ties.all())
        if name == "fp8":
            report = engine.check_fidelity()
            kept = ("worst_cosine", "worst_score_error", "fallbacks")
            row["startup_check"] = {key: value for key, value in report.items() if key in kept}
        print(json.dumps(row), flush=True)
    print(json.dumps({"fp8_vs_bf16": round(statistics.median(rates["fp8"]) / statistics.median(rates["bf16"]), 3)}))
    if args.device != "cuda":
        return
    layers = [layer.weight.shape for layer in fp8.fp8_layers(engines["fp8"].model)]
    distinct = sorted({(int(n), int(k)) for n, k in layers})
    print(json.dumps({"gemm_tflops_at_16384_tokens": gemm_rates(distinct, 16384), "shapes": distinct}))


if __name__ == "__main__":
    main()
