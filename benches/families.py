"""The new encoder families' batch speed over HTTP (a real ivy-serve, /v1/embeddings) against
sentence-transformers' `encode` on the same texts, the two taken in alternating slices.

    python benches/families.py --family mpnet               # CPU: all-mpnet-base-v2's widths, 4 of 12 layers
    python benches/families.py --family embeddinggemma      # CPU: EmbeddingGemma's widths, 4 of 24 layers
    python benches/families.py --family mpnet --device cuda --layers 0    # the full depth, bf16 on both sides

Random weights in the published widths (tests/support.py's savers; the MiniLM tokenizer stands in
for each model's own: only the embedding's gather depends on the vocabulary). Documents: prose
of 32-256 tokens. Each slice embeds every document once; the figure is the median of the
slices' ratios (server tokens/s over sentence-transformers' in the slice beside it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from corpus import passages  # noqa: E402
from support import EMBEDDINGGEMMA, MPNET_BASE, plain_tokenizer, save_embeddinggemma, save_mpnet, start_server  # noqa: E402
from timing import alternate, http_batches, report  # noqa: E402

FAMILIES = {
    "mpnet": (MPNET_BASE, lambda folder, sizes: save_mpnet(folder, **sizes)),
    "embeddinggemma": (EMBEDDINGGEMMA, lambda folder, sizes: save_embeddinggemma(folder, (3072, 768), **sizes)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4, help="layers to keep (0: the published depth)")
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--slices", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    widths, save = FAMILIES[args.family]
    sizes = dict(widths) if args.layers == 0 else {**widths, "num_hidden_layers": args.layers}
    tmp = Path(tempfile.mkdtemp(prefix="families-"))
    folder = save(tmp / args.family, sizes)

    from sentence_transformers import SentenceTransformer

    tokenizer = plain_tokenizer(folder)
    count = lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids)  # noqa: E731
    texts = passages(args.docs, 32, 256, count)
    on_gpu = args.device.startswith("cuda")
    st = SentenceTransformer(str(folder), device=args.device, model_kwargs={"dtype": torch.bfloat16} if on_gpu else {})
    server = start_server(tmp, "--model", str(folder), "--device", args.device)
    names = ("ivy-serve over HTTP", "sentence-transformers encode")
    try:
        ours = lambda: http_batches(server.url, texts, args.batch, 4, "base64")  # noqa: E731
        results = alternate(args.slices, ours, lambda: st.encode(texts, batch_size=args.batch), names)
    finally:
        server.stop()
    layers = sizes["num_hidden_layers"]
    print(f"\n{args.family} widths, {layers} layers, {args.device}, {args.docs} documents of 32-256 tokens, "
          f"client batches of {args.batch}, 4 in flight")  # fmt: skip
    report(*results, names)


if __name__ == "__main__":
    main()
