"""ROSE in-process as the benchmarks drive it: texts tokenized as Ivy does (the model's tokenizer,
truncated to its limit, no prompt), and sequences packed into steps by Tulip's rule
(tulip.split_batches), each step enqueued before the previous one is waited for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import rose
import tulip


def tokenizer(engine: rose.Engine) -> Any:
    """The model's tokenizer (the `tokenizers` package), truncating to the model's limit."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(engine.model_dir.tokenizer_json().decode())
    tok.no_padding()
    tok.enable_truncation(engine.max_input_length)
    return tok


def embed_packed(
    engine: rose.Engine, sequences: Sequence[Sequence[int]], max_batch_tokens: int | None = None
) -> np.ndarray:
    """Pooled vectors of `sequences`, packed as Tulip would under the engine's limits."""
    budget = max_batch_tokens or engine.max_batch_tokens
    ranges = tulip.split_batches([len(s) for s in sequences], budget, engine.max_batch_requests)
    return engine.embed_batches(sequences[a:b] for a, b in ranges)


def encode(engine: rose.Engine, texts: Sequence[str], max_batch_tokens: int | None = None) -> np.ndarray:
    """Pooled vectors of `texts`, tokenized and packed as the server does."""
    ids = [np.array(e.ids, dtype=np.int32) for e in tokenizer(engine).encode_batch(list(texts))]
    return embed_packed(engine, ids, max_batch_tokens)
