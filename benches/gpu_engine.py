"""Whole-model throughput on the H200: ROSE (each attention backend) against Hugging Face
transformers (sdpa, padded batches of the same sequences), Qwen3-0.6B shape with random weights
in bfloat16, on sequences of mixed 32-512 tokens; MFU against the measured 764 TFLOP/s.

    python benches/gpu_engine.py [--sequences 1024] [--backends fa2,fa3,fa4,torch,auto]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import torch

import rose
from inprocess import embed_packed
from timing import best_of

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support import QWEN3_SHAPES, save_qwen3  # noqa: E402

PEAK_TFLOPS = 764.0  # bf16 8192^3 matmul measured on this H200 (../shared/gpu/README.md)


def model_flops(shape: dict, lengths: list[int], causal: bool) -> float:
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    dense = 2 * (h * (q + 2 * kv) + q * h + 3 * h * inter) * sum(lengths)
    attention = sum(4 * n * n * q for n in lengths) * (0.5 if causal else 1.0)
    return layers * (dense + attention)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=1024)
    parser.add_argument("--backends", default="fa2,fa3,fa4,torch,auto")
    parser.add_argument("--hf-batch", type=int, default=64, help="sequences per padded transformers batch")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--cuda-graphs", default="lazy", help="lazy, eager or off")
    args = parser.parse_args()

    rng = random.Random(0)
    shape = QWEN3_SHAPES["0.6b"]
    lengths = [rng.randint(32, 512) for _ in range(args.sequences)]
    sequences = [[rng.randrange(1000, shape["vocab_size"]) for _ in range(n)] for n in lengths]
    tokens = sum(lengths)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for causal in (True, False):
            folder = save_qwen3(Path(tmp) / f"qwen3-{causal}", "0.6b", bidirectional=not causal)
            flops = model_flops(shape, lengths, causal)
            kind = "causal" if causal else "bidirectional"
            backends = args.backends.split(",")
            for name, seconds in rose_times(folder, sequences, backends, args.max_batch_tokens, args.cuda_graphs):
                rows.append((kind, f"rose {name}", tokens / seconds, flops / seconds / 1e12))
            rows.append((kind, "transformers sdpa (padded)", *hf_rate(folder, sequences, args.hf_batch, flops)))
            torch.cuda.empty_cache()
    print(
        f"{args.sequences} sequences of 32-512 tokens ({tokens} tokens), {torch.cuda.get_device_name()}, bf16, "
        f"CUDA graphs {args.cuda_graphs}"
    )
    print("| kind | engine | tokens/s | TFLOP/s | MFU | vs transformers |")
    print("|---|---|---|---|---|---|")
    for kind, name, rate, tflops in rows:
        base = next(r for k, n, r, _ in rows if k == kind and n.startswith("transformers"))
        print(f"| {kind} | {name} | {rate:,.0f} | {tflops:.0f} | {tflops / PEAK_TFLOPS:.0%} | {rate / base:.2f}x |")


def rose_times(
    folder: Path, sequences: list[list[int]], backends: list[str], max_batch_tokens: int, graphs: str
) -> list:
    engine = rose.Engine(folder, device="cuda", cuda_graphs=graphs, verify=False)
    out = []
    for backend in backends:
        engine.use_attention(backend)
        out.append((engine.attention.name, best_of(lambda: embed_packed(engine, sequences, max_batch_tokens), 3)))
    return out


def hf_rate(folder: Path, sequences: list[list[int]], batch: int, flops: float) -> tuple[float, float]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    bidirectional = getattr(model.config, "use_bidirectional_attention", False)

    def run() -> None:
        with torch.inference_mode():
            for i in range(0, len(sequences), batch):
                chunk = sequences[i : i + batch]
                width = max(map(len, chunk))
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                mask = torch.zeros(len(chunk), width, dtype=torch.long)
                for j, s in enumerate(chunk):
                    ids[j, : len(s)], mask[j, : len(s)] = torch.tensor(s), 1
                ids, mask = ids.cuda(), mask.cuda()
                if bidirectional:
                    # Key padding only: every real token sees every real token.
                    mask = torch.where(mask[:, None, None, :].bool(), 0.0, float("-inf")).to(torch.bfloat16)
                model(input_ids=ids, attention_mask=mask).last_hidden_state.float().cpu()

    seconds = best_of(run, repeats=2)
    return sum(map(len, sequences)) / seconds, flops / seconds / 1e12


if __name__ == "__main__":
    main()
