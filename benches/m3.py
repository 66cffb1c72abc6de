"""BGE-M3's three outputs (dense, lexical weights, ColBERT vectors) from one pass of a real
ivy-serve, over gRPC (`tulip.Client.encode`), against FlagEmbedding's M3 embedder asked for the
same three on the same texts, in alternating slices.

    python benches/m3.py                                   # CPU: XLM-R-large widths, 4 of 24 layers
    python benches/m3.py --device cuda --layers 0          # the full depth, bf16 on both sides

Random weights in BGE-M3's widths (tests/support.py's save_bge_m3: an XLM-RoBERTa encoder with
FlagEmbedding's colbert_linear.pt and sparse_linear.pt; the MiniLM tokenizer's vocabulary stands in
for XLM-R's 250k, which only the embedding's gather reads). gRPC, since the ColBERT vectors
(1,024 floats a token) as JSON numbers would cost the client more than the model. Documents:
prose of 32-256 tokens; the figure is the median of the slices' ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from corpus import passages  # noqa: E402
from support import plain_tokenizer, save_bge_m3, start_server  # noqa: E402
from timing import alternate, in_batches, report  # noqa: E402

XLMR_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
"""BGE-M3's encoder widths (XLM-RoBERTa large)."""

OUTPUTS = ["dense", "sparse", "multi_vector"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4, help="layers to keep (0: the published depth)")
    p.add_argument("--docs", type=int, default=128)
    p.add_argument("--slices", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    sizes = dict(XLMR_LARGE) if args.layers == 0 else {**XLMR_LARGE, "num_hidden_layers": args.layers}
    tmp = Path(tempfile.mkdtemp(prefix="m3-"))
    folder = save_bge_m3(tmp / "bge-m3", **sizes)

    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    import tulip

    tokenizer = plain_tokenizer(folder)
    count = lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids)  # noqa: E731
    texts = passages(args.docs, 32, 256, count)
    tokens = {t: len(tokenizer.encode(t).ids) for t in texts}
    on_gpu = args.device.startswith("cuda")
    m3 = M3Embedder(str(folder), use_fp16=on_gpu, devices=args.device, normalize_embeddings=True)
    server = start_server(tmp, "--model", str(folder), "--device", args.device)
    client = tulip.Client(server.grpc, timeout=600)

    def ours_batch(chunk: list[str]) -> int:
        client.encode(chunk, OUTPUTS)
        return sum(tokens[t] for t in chunk)

    def theirs() -> None:
        m3.encode(texts, batch_size=args.batch, max_length=512, return_dense=True, return_sparse=True,
                  return_colbert_vecs=True)  # fmt: skip

    names = ("ivy-serve, Encode over gRPC", "FlagEmbedding M3Embedder.encode")
    try:
        results = alternate(args.slices, lambda: in_batches(ours_batch, texts, args.batch, 4), theirs, names)
    finally:
        server.stop()
    print(f"\nBGE-M3 (dense, lexical, ColBERT), XLM-R-large widths, {sizes['num_hidden_layers']} layers, "
          f"{args.device}, {args.docs} documents of 32-256 tokens, batches of {args.batch}, 4 in flight")  # fmt: skip
    report(*results, names)


if __name__ == "__main__":
    main()
