"""How many bits the matmuls' inputs need for the start-up fidelity check (worst cosine >= 0.999
against float32): the floor under `--dtype fp8`'s fidelity, measured instead of assumed.

Each row rounds the inputs of every dense layer (activations per token, weights per output
channel) and multiplies in float32, so only the inputs' precision varies: e4m3 as served
(rose.ops.fp8), then m mantissa bits with no range limit (3 is e4m3's precision, 7 bfloat16's),
then INT8 with the same per-token and per-channel scales. Cosines against the float32 model on the
start-up check's sequences and on held-out texts (the folder's tokenizer). CPU and GPU alike.

    python benches/fp8_precision.py                          # all-MiniLM-L6-v2, its real weights
    python benches/fp8_precision.py --shape qwen3-0.6b       # Qwen3-0.6B shape, random weights
    python benches/fp8_precision.py --model DIR --device cuda

Prints JSON lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

import rose
from rose.ops import fp8
from rose.serving import fidelity

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import save_qwen3, varied_texts  # noqa: E402

Rounding = Callable[[torch.Tensor], torch.Tensor]
"""float32 [rows, k] -> the same values as a lower precision holds them, per row."""


def mantissa(bits: int) -> Rounding:
    """Round to nearest with `bits` explicit mantissa bits, any exponent."""

    def rounded(t: torch.Tensor) -> torch.Tensor:
        frac, exp = torch.frexp(t)  # frac in [0.5, 1): one implicit bit and `bits` more
        steps = 2.0 ** (bits + 1)
        return torch.ldexp(torch.round(frac * steps) / steps, exp)

    return rounded


def int8_rows(t: torch.Tensor) -> torch.Tensor:
    """Symmetric INT8 with one scale a row (its largest magnitude to 127)."""
    scale = t.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(t / scale).clamp(-127, 127) * scale


@contextlib.contextmanager
def products_through(rounding: Rounding) -> Iterator[None]:
    """Every Fp8Linear multiplies `rounding`'s inputs in float32 while inside (weights rounded
    once a layer); the engine must run without CUDA graphs, which would replay the FP8 kernels."""
    served = fp8.Fp8Linear.__call__
    weights: dict[int, torch.Tensor] = {}

    def call(layer: fp8.Fp8Linear, x: torch.Tensor) -> torch.Tensor:
        if id(layer) not in weights:
            weights[id(layer)] = rounding(layer.weight.float())
        rows = rounding(x.reshape(-1, x.shape[-1]).float())
        y = F.linear(rows, weights[id(layer)], None if layer.bias is None else layer.bias.float())
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])

    fp8.Fp8Linear.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        fp8.Fp8Linear.__call__ = served  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--shape", choices=["qwen3-0.6b"], help="a random-weight shape instead")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--texts", type=int, default=200, help="held-out texts")
    args = parser.parse_args()
    folder = args.model or rose.default_model_path()
    name = args.shape or (args.model.name if args.model else "all-MiniLM-L6-v2")
    if args.shape:
        folder = Path(tempfile.gettempdir()) / "gpu-check-qwen3-0.6b"  # fp8_speed.py's and gpu_check's
        if not (folder / "config.json").exists():
            save_qwen3(folder, "0.6b", bidirectional=False)
    engine = rose.Engine(folder, device=args.device, dtype="fp8", verify=False, cuda_graphs="off",
                         fused_decoder="off")  # fmt: skip
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(min(256, engine.max_input_length))
    sets = {
        "startup_check": fidelity.sequences(engine.vocab_size, engine.max_input_length),
        "held_out": [e.ids for e in tokenizer.encode_batch(varied_texts(args.texts, seed=5))],
    }
    references = {name: engine.reference(seqs) for name, seqs in sets.items()}

    def measure(side: str) -> None:
        row: dict[str, object] = {"model": name, "device": args.device, "inputs": side}
        for kind, seqs in sets.items():
            cos = fidelity.cosines(engine.pooled_states(seqs), references[kind])
            row[f"{kind}_worst"] = round(float(cos.min()), 5)
            row[f"{kind}_mean"] = round(float(cos.mean()), 5)
        row["holds"] = min(row["startup_check_worst"], row["held_out_worst"]) >= fidelity.THRESHOLD  # type: ignore[type-var]
        print(json.dumps(row), flush=True)

    measure("e4m3 (served)")
    for bits in range(3, 8):
        with products_through(mantissa(bits)):
            measure(f"{bits} mantissa bits")
    with products_through(int8_rows):
        measure("int8")


if __name__ == "__main__":
    main()
