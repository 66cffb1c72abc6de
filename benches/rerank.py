"""Reranking speed: 1 query x N documents of about 200 tokens over HTTP (`/rerank`, a real
ivy-serve) against the peer on the same pairs in the same run, the two taken in alternating
slices: pairs/s at saturation (`--concurrency` clients), then one request's p50/p99 at a steady
rate (half the saturated rate unless `--rate`).

    python benches/rerank.py --shape ms-marco-minilm --docs 100            # CPU: CrossEncoder.predict
    python benches/rerank.py --shape bge-reranker-base --docs 20
    python benches/rerank.py --shape qwen3-reranker-0.6b --docs 100 1000 --device cuda   # transformers bf16 peer

Random weights in each published shape (the MiniLM tokenizer's 30,522-token vocabulary stands in
for a shape's own: only the embedding's gather depends on it). The peer: sentence-transformers'
on CUDA transformers in bf16, batches of 32 sorted by length (the causal reranker's yes/no logits
at the last token of its rendered prompt); on the CPU `CrossEncoder.predict` in float32 for the
cross-encoders.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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


def workload(shape: str, count: int, doc_tokens: int = 200) -> tuple[Path, str, list[str]]:
    """`shape`'s random-weight folder, a 6-12-token query and `count` documents of `doc_tokens`
    +- 20 tokens (as the folder's tokenizer counts them), the same every run."""
    folder = save(shape, Path(tempfile.gettempdir()) / f"rerank-{shape}")
    tokenizer = plain_tokenizer(folder)
    tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)  # noqa: E731
    docs = documents(count, doc_tokens - 20, doc_tokens + 20, tokens)
    return folder, queries(1, 6, 12, tokens)[0], docs


def peer(shape: str, folder: Path, device: str):
    """The peer's scorer of (query, document) pairs: on CUDA transformers in bf16, batches of 32
    sorted by length; on the CPU CrossEncoder.predict for the cross-encoders (float32)."""
    causal = SHAPES[shape][0] == "qwen3"
    if not causal and device != "cuda":
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(folder), device=device)
        return lambda pairs: model.predict(pairs, batch_size=32)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kind = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    model = kind.from_pretrained(folder, dtype=dtype).to(device).eval()
    if not causal:
        tokenizer = AutoTokenizer.from_pretrained(folder)

        def cross(pairs: list[tuple[str, str]]) -> np.ndarray:
            encoded = tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation=True)
            fields = [dict(zip(encoded.keys(), row, strict=True)) for row in zip(*encoded.values(), strict=True)]

            def forward(batch: list[int]) -> torch.Tensor:
                padded = tokenizer.pad([fields[i] for i in batch], return_tensors="pt").to(device)
                return model(**padded).logits[:, 0].float().sigmoid()

            return in_sorted_batches([len(f["input_ids"]) for f in fields], forward)

        return cross

    from rose.serving.task import QWEN3_RERANKER_TEMPLATE as t

    tokenizer = plain_tokenizer(folder)
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    prefix, suffix = ids(t["prefix"]), ids(t["suffix"])
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        rendered = [prefix + ids(t["content"].format(instruction=t["default_instruction"], query=q, document=d))
                    + suffix for q, d in pairs]  # fmt: skip

        def forward(batch: list[int]) -> torch.Tensor:
            width = max(len(rendered[i]) for i in batch)
            # Left padding, so that every sequence's last token is at the end.
            input_ids = torch.tensor([[0] * (width - len(rendered[i])) + rendered[i] for i in batch], device=device)
            mask = torch.tensor([[0] * (width - len(rendered[i])) + [1] * len(rendered[i]) for i in batch],
                                device=device)  # fmt: skip
            logits = model(input_ids=input_ids, attention_mask=mask).logits[:, -1].float()
            return torch.sigmoid(logits[:, yes] - logits[:, no])

        return in_sorted_batches([len(r) for r in rendered], forward)

    return score


def in_sorted_batches(lengths: list[int], forward, batch: int = 32) -> np.ndarray:
    """`forward(indices)` over batches of `batch` sequences sorted by length; scores in input order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    out = np.zeros(len(lengths), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, len(order), batch):
            chosen = order[start : start + batch]
            out[chosen] = forward(chosen).cpu().numpy()
    return out


def post(session: requests.Session, url: str, body: dict) -> requests.Response:
    answer = session.post(f"{url}/rerank", json=body, timeout=600)
    answer.raise_for_status()
    return answer


SPLIT = ("tokenization", "queue", "inference", "transfer", "total")
"""The server's own time split of a request (Ivy's x-*-time headers)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="ms-marco-minilm")
    parser.add_argument("--docs", type=int, nargs="+", default=[100])
    parser.add_argument("--doc-tokens", type=int, default=200)
    parser.add_argument("--requests", type=int, default=5, help="requests per slice")
    parser.add_argument("--rounds", type=int, default=3, help="alternating slices of each side")
    parser.add_argument("--concurrency", type=int, default=4, help="clients in flight at saturation")
    parser.add_argument("--rate", type=float, help="steady requests/s for the latency (default: half saturation)")
    parser.add_argument("--latency-requests", type=int, default=50)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--server-arg", action="append", default=[], help="extra ivy-serve flag (repeatable)")
    args = parser.parse_args()

    folder, query, docs = workload(args.shape, max(args.docs), args.doc_tokens)
    tokenizer = plain_tokenizer(folder)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)  # noqa: E731
    task = ["--task", "score"] if SHAPES[args.shape][0] == "qwen3" else []
    flags = ["--model", str(folder), "--device", args.device, *task, *args.server_arg]
    server = start_server(Path(tempfile.mkdtemp()), *flags)
    theirs = peer(args.shape, folder, args.device)
    print(f"{args.shape} on {args.device} ({' '.join(args.server_arg) or 'default flags'}); query of "
          f"{count(query)} tokens, documents of ~{args.doc_tokens} tokens")  # fmt: skip
    print("| documents | rose over HTTP at saturation: pairs/s | steady rate: requests/s | p50 ms | p99 ms "
          "| peer: pairs/s | ratio (median of slices) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    session = requests.Session()
    try:
        for n in args.docs:
            body = {"query": query, "texts": docs[:n], "truncate": True}
            pairs = [(query, d) for d in docs[:n]]
            for _ in range(5):  # warm: a bucket's graph is captured on its second hit
                post(session, server.url, body)
            theirs(pairs)
            ours_rates, peer_rates = [], []
            with ThreadPoolExecutor(args.concurrency) as clients:
                sessions = [requests.Session() for _ in range(args.concurrency)]
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    burst = lambda s, b=body: [post(s, server.url, b) for _ in range(args.requests)]  # noqa: E731
                    list(clients.map(burst, sessions))
                    ours_rates.append(n * args.requests * args.concurrency / (time.perf_counter() - start))
                    start = time.perf_counter()
                    for _ in range(args.requests):
                        theirs(pairs)
                    if args.device == "cuda":
                        torch.cuda.synchronize()
                    peer_rates.append(n * args.requests / (time.perf_counter() - start))
            # Latency at a steady rate: half the saturated request rate, one request at a time.
            rate = args.rate or statistics.median(ours_rates) / n / 2
            latencies, split = [], {part: [] for part in SPLIT}
            due = time.perf_counter()
            for _ in range(args.latency_requests):
                time.sleep(max(0.0, due - time.perf_counter()))
                due += 1 / rate
                began = time.perf_counter()
                answer = post(session, server.url, body)
                latencies.append(time.perf_counter() - began)
                for part in SPLIT:
                    split[part].append(float(answer.headers[f"x-{part}-time"]))
            ratios = [a / b for a, b in zip(ours_rates, peer_rates, strict=True)]
            p50, p99 = np.percentile(latencies, [50, 99]) * 1000
            print(f"| {n} | {statistics.median(ours_rates):,.1f} | {rate:.1f} | {p50:.1f} | {p99:.1f} | "
                  f"{statistics.median(peer_rates):,.1f} | {statistics.median(ratios):.2f}x "
                  f"({', '.join(f'{r:.2f}' for r in ratios)}) |")  # fmt: skip
            medians = ", ".join(f"{part} {statistics.median(v):.2f}" for part, v in split.items())
            print(f"  server-side medians at the steady rate, ms: {medians}", file=sys.stderr)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
