"""`ivy-embed`: embeds a corpus into vector files, in this process or against a running server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from tulip.reindex.corpus import FORMATS, Corpus, parse_shard, shard_range
from tulip.reindex.embedders import Embedder, InProcess, OverHttp
from tulip.reindex.output import OUTPUT_DTYPES, OUTPUT_FORMATS, Layout, settings
from tulip.reindex.run import BATCH_SIZE, CONCURRENCY, reindex

log = logging.getLogger("ivy-embed")

WARMUP = "512x8"
"""The in-process engine's warm-up step (8 sequences of 64 tokens): longer than any short-query
path, so the attention backends of long batches are imported and checked before the clock starts."""

SWITCH_INTERVAL = 0.0005
"""Seconds a thread holds the GIL before another may take it (Python's default: 0.005)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ivy-embed",
        description="Embed a corpus (JSON Lines, Parquet or text; gzip too) into Parquet or .npy parts, resumably.",
    )
    p.add_argument("corpus", help="the corpus file")
    p.add_argument("--output", required=True, help="the folder of the vector parts (and of a resumed run)")
    src = p.add_argument_group("corpus")
    src.add_argument("--format", default="auto", choices=("auto", *FORMATS), help="how to read it (default: by suffix)")
    src.add_argument("--id-field", default="id", help="JSON Lines / Parquet id field (default: id)")
    src.add_argument("--text-field", default="text", help="JSON Lines / Parquet text field (default: text)")
    src.add_argument("--shard", default="0/1", help="I/N: embed the I-th of N contiguous parts (0-based)")
    out = p.add_argument_group("output")
    out.add_argument("--output-format", default="parquet", choices=OUTPUT_FORMATS)
    out.add_argument("--output-dtype", default="float32", choices=OUTPUT_DTYPES, help="binary: packed sign bits")
    out.add_argument("--prompt-name", help="a prompt of the model's sentence-transformers config")
    out.add_argument("--dimensions", type=int, help="Matryoshka truncation")
    eng = p.add_argument_group("engine", "in this process unless --server names a running ivy-serve")
    eng.add_argument("--server", help="a running ivy-serve's URL (http://host:3000) instead of loading the model here")
    eng.add_argument(
        "--api-key", default=os.environ.get("API_KEY"), help="a key of a server with --api-key (default: $API_KEY)"
    )
    eng.add_argument("--model", help="a model folder or hub id (default: all-MiniLM-L6-v2)")
    eng.add_argument("--revision", help="the hub revision of a hub id")
    eng.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    eng.add_argument("--dtype", default="auto", help="the engine's dtype, as ivy-serve takes it")
    eng.add_argument("--max-batch-tokens", type=int, help="tokens per engine step")
    eng.add_argument(
        "--cuda-graphs", default="lazy", choices=("off", "lazy", "eager"), help="as ivy-serve takes it (default: lazy)"
    )
    run = p.add_argument_group("batching")
    run.add_argument("--window", type=int, default=4096, help="documents sorted by length together; one part each")
    run.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="most documents a request (and 1 MB of text)")
    run.add_argument("--concurrency", type=int, default=CONCURRENCY, help="requests in flight")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the command; its exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    # Threads waiting on answers share the GIL with the corpus reader: a thread whose answer
    # arrived waits up to the switch interval (5 ms by default) for it, leaving the engine idle.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        shard, shards = parse_shard(args.shard)
        corpus = Corpus.open(args.corpus, args.format, args.id_field, args.text_field)
        count = corpus.count()
        documents = shard_range(count, shard, shards)
        embedder = make_embedder(args)
        recorded = settings(
            corpus=str(corpus.path), format=corpus.format, id_field=args.id_field, text_field=args.text_field,
            documents=count, window=args.window, output_dtype=args.output_dtype, prompt_name=args.prompt_name,
            dimensions=args.dimensions, model=args.server or args.model, revision=args.revision,
        )  # fmt: skip
        layout = Layout(Path(args.output), shard, shards, args.output_format, recorded)
        log.info("shard %d/%d: documents %d-%d of %d", shard, shards, documents.start, documents.stop, count)
        totals = reindex(
            corpus, layout, embedder, documents, window=args.window, batch_size=args.batch_size,
            concurrency=args.concurrency,
        )  # fmt: skip
    except (ValueError, RuntimeError, OSError) as why:
        log.error("%s", why)
        return 1
    log.info(
        "embedded %d documents (%d already done) in %.1f s: %.0f tokens/s",
        totals.documents, totals.skipped, totals.seconds, totals.tokens_per_second,
    )  # fmt: skip
    return 0


def make_embedder(args: argparse.Namespace) -> Embedder:
    if args.server:
        # A server's API_KEY may list several keys; any one of them is accepted.
        key = args.api_key.split(",")[0].strip() if args.api_key else None
        return OverHttp(args.server, args.output_dtype, args.prompt_name, args.dimensions, key)
    from tulip import Client

    flags = {"revision": args.revision, "device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs}
    # A server defers its slow attention imports and long-batch check past its first queries; a
    # batch job has no first queries, so one long warm-up step does all of it while loading.
    start = time.monotonic()
    client = Client.in_process(args.model, max_batch_tokens=args.max_batch_tokens, warmup=WARMUP, **flags)
    log.info("engine ready in %.1f s", time.monotonic() - start)
    return InProcess(client, args.output_dtype, args.prompt_name, args.dimensions)


if __name__ == "__main__":
    sys.exit(main())
