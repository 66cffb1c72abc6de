"""The benchmarks' texts: real English prose, sampled with a fixed seed.

data/corpus.txt.gz holds 1,688 paragraphs of the docstrings of CPython 3.11's standard library
(PSF licence), one per line, kept only where they read as prose (no code, no tables).
"""

from __future__ import annotations

import gzip
import random
import re
from collections.abc import Callable
from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "corpus.txt.gz"


def sentences() -> list[str]:
    text = gzip.decompress(CORPUS.read_bytes()).decode()
    return [s for p in text.splitlines() for s in re.split(r"(?<=[.!?])\s+", p) if len(s) > 1]


def documents(
    count: int, min_tokens: int, max_tokens: int, count_tokens: Callable[[str], int], seed: int = 0
) -> list[str]:
    """`count` passages of consecutive sentences, each between min_tokens and max_tokens long
    (as `count_tokens` counts them), for the batch re-indexing pattern."""
    rng = random.Random(seed)
    pool = sentences()
    docs = []
    while len(docs) < count:
        target = rng.randint(min_tokens, max_tokens)
        start = rng.randrange(len(pool))
        doc, i = pool[start], start + 1
        while count_tokens(doc) < target:
            doc += " " + pool[i % len(pool)]
            i += 1
        words = doc.split()
        while count_tokens(" ".join(words)) > max_tokens:
            words = words[: int(len(words) * 0.9)]
        docs.append(" ".join(words))
    return docs


def queries(
    count: int, min_tokens: int, max_tokens: int, count_tokens: Callable[[str], int], seed: int = 1
) -> list[str]:
    """`count` search-like queries of min_tokens to max_tokens: word spans cut out of sentences."""
    rng = random.Random(seed)
    pool = [s.split() for s in sentences() if len(s.split()) >= 4]
    out = []
    while len(out) < count:
        words = rng.choice(pool)
        start = rng.randrange(len(words))
        n = rng.randint(2, 24)
        query = " ".join(words[start : start + n]).strip(".,;:")
        if query and min_tokens <= count_tokens(query) <= max_tokens:
            out.append(query)
    return out


def passages(
    count: int, min_tokens: int, max_tokens: int, count_tokens: Callable[[str], int], seed: int = 0
) -> list[str]:
    """`count` passages of consecutive sentences of about min_tokens to max_tokens (each sentence
    tokenized once: benches/corpus.documents retokenizes every passage as it grows)."""
    rng = random.Random(seed)
    pool = sentences()
    lengths = [count_tokens(s) for s in pool]
    out = []
    while len(out) < count:
        target, i, total, parts = rng.randint(min_tokens, max_tokens), rng.randrange(len(pool)), 2, []
        while total + lengths[i % len(pool)] <= max_tokens and (total < target or not parts):
            parts.append(pool[i % len(pool)])
            total += lengths[i % len(pool)]
            i += 1
        out.append(" ".join(parts) or pool[i % len(pool)][:200])
    return out
