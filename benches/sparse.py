"""SPLADE's batch speed over HTTP (a real ivy-serve, TEI's /embed_sparse) against
sentence-transformers' `SparseEncoder.encode` on the same texts, in alternating slices.

    python benches/sparse.py                                 # CPU: BERT-base widths, 4 of 12 layers
    python benches/sparse.py --device cuda --layers 0        # the full depth, bf16 on both sides

Random weights in naver/splade-cocondenser-ensembledistil's widths (tests/support.py's
save_splade: a BertForMaskedLM saved as SparseEncoder saves it, the MiniLM tokenizer's 30,522
ids). Documents: prose of 32-256 tokens. Each slice embeds every document once; the figure is
the median of the slices' ratios (server tokens/s over SparseEncoder's in the slice beside it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from corpus import passages  # noqa: E402
from support import SPLADE_BASE, plain_tokenizer, save_splade, start_server  # noqa: E402
from timing import alternate, post_batches, report  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4, help="layers to keep (0: the published depth)")
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--slices", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    sizes = dict(SPLADE_BASE) if args.layers == 0 else {**SPLADE_BASE, "num_hidden_layers": args.layers}
    tmp = Path(tempfile.mkdtemp(prefix="sparse-"))
    folder = save_splade(tmp / "splade", **sizes)

    from sentence_transformers import SparseEncoder

    tokenizer = plain_tokenizer(folder)
    count = lambda t: len(tokenizer.encode(t, add_special_tokens=False).ids)  # noqa: E731
    texts = passages(args.docs, 32, 256, count)
    on_gpu = args.device.startswith("cuda")
    st = SparseEncoder(str(folder), device=args.device, model_kwargs={"dtype": torch.bfloat16} if on_gpu else {})
    server = start_server(tmp, "--model", str(folder), "--device", args.device)
    names = ("ivy-serve /embed_sparse", "SparseEncoder.encode")
    body = lambda chunk: {"inputs": chunk, "truncate": True}  # noqa: E731
    try:
        ours = lambda: post_batches(server.url, "/embed_sparse", texts, args.batch, 4, body)  # noqa: E731
        results = alternate(args.slices, ours, lambda: st.encode(texts, batch_size=args.batch), names)
    finally:
        server.stop()
    print(f"\nSPLADE, BERT-base widths, {sizes['num_hidden_layers']} layers, {args.device}, {args.docs} documents "
          f"of 32-256 tokens, client batches of {args.batch}, 4 in flight")  # fmt: skip
    report(*results, names)


if __name__ == "__main__":
    main()
