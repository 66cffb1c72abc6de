"""The re-index loop: a shard's documents in windows; inside a window, sorted by length and
embedded in batches several at a time (so the engine packs full steps); each window written as
one part in the corpus' order; parts already written skipped."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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


BATCH_SIZE, CONCURRENCY = 512, 8
"""Documents a request and requests in flight: as many tokens in flight as ivy-serve's default
--max-queued-tokens takes for documents of up to 256 tokens, in half the requests of 256 x 16 (a
request costs the Python side about the same whatever its size, and that cost bounded the HTTP
path on a small model)."""

MAX_BATCH_CHARS = 1_000_000
"""Text a batch holds at most: half of ivy-serve's default --payload-limit, so a batch of long
documents is still one accepted request."""


def length_batches(texts: list[str], batch_size: int, max_chars: int = MAX_BATCH_CHARS) -> list[list[int]]:
    """The positions of `texts` in batches of at most `batch_size` documents and `max_chars`
    characters (a longer document alone), by length (longest first), so that each batch's
    sequences are alike and the longest start first."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches: list[list[int]] = []
    chars = 0
    for i in order:
        if not batches or len(batches[-1]) == batch_size or chars + len(texts[i]) > max_chars:
            batches.append([])
            chars = 0
        batches[-1].append(i)
        chars += len(texts[i])
    return batches


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


@dataclass
class _Window:
    """One window's documents, its batches' positions and their pending answers."""

    k: int
    ids: list[str]
    batches: list[list[int]]
    answers: list[Future]


def _submit(pool: ThreadPoolExecutor, embedder: Embedder, k: int, docs: list[tuple[str, str]], size: int) -> _Window:
    ids = [doc_id for doc_id, _ in docs]
    # An empty document embeds as a space: the model's vector of no text, not an error.
    texts = [text if text.strip() else " " for _, text in docs]
    batches = length_batches(texts, size)
    answers = [pool.submit(embedder.embed, [texts[i] for i in batch]) for batch in batches]
    return _Window(k, ids, batches, answers)


def reindex(
    corpus: Corpus,
    layout: Layout,
    embedder: Embedder,
    shard: range,
    *,
    window: int = 4096,
    batch_size: int = BATCH_SIZE,
    concurrency: int = CONCURRENCY,
) -> Totals:
    """Embeds documents `shard` of `corpus` into `layout`'s parts; returns what it did.

    The next window is read and its batches queued before this one's answers are gathered, and
    parts are written by a thread of their own, so the engine never waits between windows."""
    layout.prepare()
    parts = range(0, len(shard), window)
    finished = sum(min(window, len(shard) - start) for k, start in enumerate(parts) if layout.done(k))
    totals = Totals(skipped=finished)
    progress = Progress(len(shard), finished)
    begin = time.monotonic()
    writes: list[Future] = []

    def gather(w: _Window) -> None:
        out: np.ndarray | None = None
        for batch, answer in zip(w.batches, w.answers, strict=True):
            vectors, tokens = answer.result()
            if out is None:
                out = np.empty((len(w.ids), vectors.shape[1]), dtype=vectors.dtype)
            out[batch] = vectors
            totals.tokens += tokens
            progress.add(len(batch), tokens)
        assert out is not None
        writes.append(writer.submit(layout.write, w.k, w.ids, out))
        totals.documents += len(w.ids)
        for done in [f for f in writes if f.done()]:
            done.result()  # a failed write stops the run here
            writes.remove(done)

    with (
        ThreadPoolExecutor(concurrency, thread_name_prefix="ivy-embed") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="ivy-embed-write") as writer,
    ):
        ahead: deque[_Window] = deque()
        documents = corpus.documents(shard.start, shard.stop)
        for k, docs in enumerate(windows(documents, window)):
            if layout.done(k):
                continue
            ahead.append(_submit(pool, embedder, k, docs, batch_size))
            if len(ahead) > 1:
                gather(ahead.popleft())
        while ahead:
            gather(ahead.popleft())
        for f in writes:
            f.result()
    progress.close()
    totals.seconds = time.monotonic() - begin
    return totals
