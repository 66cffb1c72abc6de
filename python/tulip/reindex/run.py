"""The re-index loop: a shard's documents in windows; inside a window, sorted by length and
embedded in batches several at a time (so the engine packs full steps); each window written as
one part in the corpus' order; parts already written skipped."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tulip.reindex.corpus import Corpus
from tulip.reindex.embedders import Embedder
from tulip.reindex.output import Layout

log = logging.getLogger("ivy-embed")


@dataclass
class Totals:
    """What a run did."""

    documents: int = 0
    skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def length_batches(texts: list[str], batch_size: int) -> list[list[int]]:
    """The positions of `texts` in batches of `batch_size`, by length (longest first), so that
    each batch's sequences are alike and the longest start first."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def windows(documents: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    """`documents` in consecutive lists of `size` (the last may be shorter)."""
    while window := list(itertools.islice(documents, size)):
        yield window


class Progress:
    """A bar (documents, tokens/s, ETA) on a terminal; a log line every `every` seconds otherwise."""

    def __init__(self, total: int, done: int, every: float = 10.0) -> None:
        self.total, self.done, self.initial, self.tokens, self.every = total, done, done, 0, every
        self.start = self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="doc", dynamic_ncols=True)

    def add(self, documents: int, tokens: int) -> None:
        self.done += documents
        self.tokens += tokens
        rate = self.tokens / max(time.monotonic() - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update(documents)
            self.bar.set_postfix_str(f"{rate:,.0f} tokens/s")
            return
        now = time.monotonic()
        if now - self.last >= self.every or self.done == self.total:
            self.last = now
            left = self.total - self.done
            docs_rate = (self.done - self.initial) / max(now - self.start, 1e-9)
            eta = left / docs_rate if docs_rate else float("inf")
            log.info("%d/%d documents, %.0f tokens/s, ETA %.0f s", self.done, self.total, rate, eta)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def reindex(
    corpus: Corpus,
    layout: Layout,
    embedder: Embedder,
    shard: range,
    *,
    window: int = 4096,
    batch_size: int = 64,
    concurrency: int = 4,
) -> Totals:
    """Embeds documents `shard` of `corpus` into `layout`'s parts; returns what it did."""
    layout.prepare()
    parts = range(0, len(shard), window)
    finished = sum(min(window, len(shard) - start) for k, start in enumerate(parts) if layout.done(k))
    totals = Totals(skipped=finished)
    progress = Progress(len(shard), finished)
    begin = time.monotonic()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="ivy-embed") as pool:
        documents = corpus.documents(shard.start, shard.stop)
        for k, docs in enumerate(windows(documents, window)):
            if layout.done(k):
                continue
            ids = [doc_id for doc_id, _ in docs]
            # An empty document embeds as a space: the model's vector of no text, not an error.
            texts = [text if text.strip() else " " for _, text in docs]
            batches = length_batches(texts, batch_size)
            answers = pool.map(embedder.embed, [[texts[i] for i in batch] for batch in batches])
            out: np.ndarray | None = None
            for batch, (vectors, tokens) in zip(batches, answers, strict=True):
                if out is None:
                    out = np.empty((len(texts), vectors.shape[1]), dtype=vectors.dtype)
                out[batch] = vectors
                totals.tokens += tokens
                progress.add(len(batch), tokens)
            assert out is not None
            layout.write(k, ids, out)
            totals.documents += len(docs)
    progress.close()
    totals.seconds = time.monotonic() - begin
    return totals
