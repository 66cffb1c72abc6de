"""Reranking speed: 1 query x N documents of about 200 tokens over HTTP (`/rerank`, a real
ivy-serve) against the peer on the same pairs in the same run, the two taken in alternating
slices; pairs/s and the request's p50/p99.

    python benches/rerank.py --shape ms-marco-minilm --docs 100            # CPU: CrossEncoder.predict
    python benches/rerank.py --shape bge-reranker-base --docs 20
    python benches/rerank.py --shape qwen3-reranker-0.6b --docs 100 1000 --device cuda   # transformers bf16

Random weights in each published shape (the MiniLM tokenizer's 30,522-token vocabulary stands in
for a shape's own: only the embedding's gather depends on it). The peer: sentence-transformers'
`CrossEncoder.predict` for the cross-encoders; for Qwen3-Reranker, transformers' causal LM on the
rendered prompts, batched and sorted by length, reading the yes/no logits at the last token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from corpus import documents, queries  # noqa: E402
from support import plain_tokenizer, start_server  # noqa: E402

SHAPES = {
    "ms-marco-minilm": ("bert", dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536)),
    "bge-reranker-base": ("xlm-roberta", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                              intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1)),
    "qwen3-reranker-0.6b": ("qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                          num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                                          max_position_embeddings=32768)),
}  # fmt: skip


def save(shape: str, folder: Path) -> Path:
    """A random-weight folder of `shape`, saved as the published model is."""
    from support import save_cross_encoder, save_qwen3_reranker

    family, sizes = SHAPES[shape]
    if (folder / "config.json").exists():
        return folder
    if family == "qwen3":
        save_qwen3_reranker(folder)
    else:
        save_cross_encoder(folder, family)
    config = json.loads((folder / "config.json").read_text())
    # Re-made at the shape's widths: the helpers save tiny ones.
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    model_type = config.pop("model_type")
    config.pop("layer_types", None)  # per layer: re-made for the new depth
    new = AutoConfig.for_model(model_type, **{**config, **sizes})
    kind = AutoModelForCausalLM if family == "qwen3" else AutoModelForSequenceClassification
    model = kind.from_config(new)
    if family == "qwen3":
        model = model.to(torch.bfloat16)
    model.eval().save_pretrained(folder)
    return folder


def peer(shape: str, folder: Path, device: str):
    """The peer's scorer of (query, document) pairs."""
    if SHAPES[shape][0] != "qwen3":
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(folder), device=device)
        return lambda pairs: model.predict(pairs, batch_size=32)
    from transformers import AutoModelForCausalLM

    from rose.serving.task import QWEN3_RERANKER_TEMPLATE as t

    tokenizer = plain_tokenizer(folder)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    prefix, suffix = ids(t["prefix"]), ids(t["suffix"])
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        rendered = [prefix + ids(t["content"].format(instruction=t["default_instruction"], query=q, document=d))
                    + suffix for q, d in pairs]  # fmt: skip
        order = sorted(range(len(rendered)), key=lambda i: len(rendered[i]))
        out = np.zeros(len(rendered), dtype=np.float32)
        for start in range(0, len(order), 32):
            batch = [rendered[i] for i in order[start : start + 32]]
            width = max(map(len, batch))
            # Left padding, so that every sequence's last token is at the end.
            input_ids = torch.tensor([[0] * (width - len(b)) + b for b in batch], device=device)
            mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=device)
            with torch.no_grad():
                logits = model(input_ids=input_ids, attention_mask=mask).logits[:, -1].float()
            out[order[start : start + 32]] = torch.sigmoid(logits[:, yes] - logits[:, no]).cpu().numpy()
        return out

    return score


SPLIT = ("tokenization", "queue", "inference", "transfer", "total")
"""The server's own time split of a request (Ivy's x-*-time headers)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="ms-marco-minilm")
    parser.add_argument("--docs", type=int, nargs="+", default=[100])
    parser.add_argument("--doc-tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=5, help="requests per slice")
    parser.add_argument("--rounds", type=int, default=3, help="alternating slices of each side")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--server-arg", action="append", default=[], help="extra ivy-serve flag (repeatable)")
    args = parser.parse_args()

    folder = save(args.shape, Path(tempfile.gettempdir()) / f"rerank-{args.shape}")
    tokenizer = plain_tokenizer(folder)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)  # noqa: E731
    docs = documents(max(args.docs), args.doc_tokens - 20, args.doc_tokens + 20, count)
    query = queries(1, 6, 12, count)[0]
    task = ["--task", "score"] if SHAPES[args.shape][0] == "qwen3" else []
    flags = ["--model", str(folder), "--device", args.device, *task, *args.server_arg]
    server = start_server(Path(tempfile.mkdtemp()), *flags)
    theirs = peer(args.shape, folder, args.device)
    print(f"{args.shape} on {args.device} ({' '.join(args.server_arg) or 'default flags'}); query of "
          f"{count(query)} tokens, documents of ~{args.doc_tokens} tokens")  # fmt: skip
    print("| documents | rose over HTTP: pairs/s | p50 ms | p99 ms | peer: pairs/s | ratio (median of slices) |")
    print("|---|---|---|---|---|---|")
    session = requests.Session()
    try:
        for n in args.docs:
            body = {"query": query, "texts": docs[:n], "truncate": True}
            pairs = [(query, d) for d in docs[:n]]
            for _ in range(5):  # warm: a bucket's graph is captured on its second hit
                session.post(f"{server.url}/rerank", json=body, timeout=600).raise_for_status()
            theirs(pairs)
            ours_rates, peer_rates, latencies = [], [], []
            split: dict[str, list[float]] = {part: [] for part in SPLIT}
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(args.requests):
                    began = time.perf_counter()
                    answer = session.post(f"{server.url}/rerank", json=body, timeout=600)
                    answer.raise_for_status()
                    latencies.append(time.perf_counter() - began)
                    for part in SPLIT:
                        split[part].append(float(answer.headers[f"x-{part}-time"]))
                ours_rates.append(n * args.requests / (time.perf_counter() - start))
                start = time.perf_counter()
                for _ in range(args.requests):
                    theirs(pairs)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                peer_rates.append(n * args.requests / (time.perf_counter() - start))
            ratios = [a / b for a, b in zip(ours_rates, peer_rates, strict=True)]
            p50, p99 = np.percentile(latencies, [50, 99]) * 1000
            print(f"| {n} | {statistics.median(ours_rates):,.1f} | {p50:.1f} | {p99:.1f} | "
                  f"{statistics.median(peer_rates):,.1f} | {statistics.median(ratios):.2f}x "
                  f"({', '.join(f'{r:.2f}' for r in ratios)}) |")  # fmt: skip
            medians = ", ".join(f"{part} {statistics.median(v):.2f}" for part, v in split.items())
            print(f"  server-side medians, ms: {medians}", file=sys.stderr)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
