"""A batch whose sequences all begin with the same tokens, laid out so that a causal model reads
the common prefix once (pure logic). A causal reranker's pairs share their template's system
prompt, the instruction and the query, a quarter of a pair's tokens for ~200-token documents:
the prefix runs as a sequence of its own, and each sequence's remaining tokens attend to the
prefix's keys and then to their own, as they would have in the whole sequence."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_PREFIX = 32
"""Fewer shared tokens save less than the gathers of the prefix's keys cost."""


@dataclass(frozen=True)
class PrefixLayout:
    """The batch as the model runs it: the prefix as sequence 0, then each sequence's suffix."""

    prefix: int
    """Tokens every sequence begins with."""
    ids: np.ndarray
    """[prefix + suffix tokens] int32: the prefix, then each suffix."""
    cu_seqlens: np.ndarray
    """[sequences + 2] int32: offsets of the prefix and of each suffix in `ids`."""
    positions: np.ndarray
    """[tokens] int32: each token's position in its original sequence."""
    key_cu_seqlens: np.ndarray
    """[sequences + 2] int32: offsets of each sequence's keys (the prefix's, then the prefix's
    and the suffix's) in the gathered keys."""
    key_rows: np.ndarray
    """[keys] int32: the row of `ids` each gathered key comes from."""


def common_prefix(ids: np.ndarray, cu_seqlens: np.ndarray) -> int:
    """Tokens that every sequence begins with, short of the shortest sequence's last token (each
    keeps at least one token of its own: the one a causal model pools)."""
    starts, lengths = cu_seqlens[:-1], np.diff(cu_seqlens)
    if len(lengths) < 2 or lengths.min() < 2:
        return 0
    width = int(lengths.min()) - 1
    heads = ids[starts[:, None] + np.arange(width)[None, :]]
    differs = (heads != heads[0]).any(axis=0)
    return int(differs.argmax()) if differs.any() else width


def shared_prefix(ids: np.ndarray, cu_seqlens: np.ndarray, min_prefix: int = MIN_PREFIX) -> PrefixLayout | None:
    """The layout that reads the sequences' common prefix once, or None where it is shorter than
    `min_prefix` (or there are fewer than two sequences)."""
    prefix = common_prefix(ids, cu_seqlens)
    if prefix < min_prefix:
        return None
    starts, lengths = cu_seqlens[:-1].astype(np.int64), np.diff(cu_seqlens).astype(np.int64)
    suffix_lengths = lengths - prefix
    keep = np.ones(len(ids), dtype=bool)
    for start in starts:  # a slice a sequence: at most a few hundred
        keep[start : start + prefix] = False
    new_ids = np.concatenate([ids[:prefix], ids[keep]]).astype(np.int32)
    cu = np.concatenate([[0, prefix], prefix + np.cumsum(suffix_lengths)]).astype(np.int32)
    # Positions: 0..prefix-1, then each suffix from `prefix` on.
    positions = np.arange(len(new_ids), dtype=np.int64)
    positions[prefix:] -= np.repeat(cu[1:-1].astype(np.int64), suffix_lengths) - prefix
    key_lengths = np.concatenate([[prefix], lengths])
    key_cu = np.concatenate([[0], np.cumsum(key_lengths)]).astype(np.int32)
    # Keys: the prefix's rows, then for each sequence the prefix's rows and its suffix's.
    prefix_rows = np.arange(prefix)
    parts = [prefix_rows]
    for i in range(len(lengths)):
        parts += [prefix_rows, np.arange(cu[i + 1], cu[i + 2])]
    rows = np.concatenate(parts).astype(np.int32)
    return PrefixLayout(prefix, new_ids, cu, positions.astype(np.int32), key_cu, rows)
