"""The shared-prefix layout (rose.runtime.shared_prefix): every original sequence is the gathered
keys of its slot, in order, and every token keeps its original position."""

from __future__ import annotations

import numpy as np

from rose.runtime.shared_prefix import common_prefix, shared_prefix


def packed(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
    cu = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int32)
    return ids, cu


def test_every_sequence_is_its_keys_and_keeps_its_positions() -> None:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, 40).tolist()
    sequences = [prefix + rng.integers(0, 1000, n).tolist() for n in (1, 5, 200, 37)]
    layout = shared_prefix(*packed(sequences))
    assert layout is not None and layout.prefix == 40
    assert layout.ids[:40].tolist() == prefix and len(layout.ids) == 40 + 1 + 5 + 200 + 37
    for i, sequence in enumerate(sequences):
        keys = layout.key_rows[layout.key_cu_seqlens[i + 1] : layout.key_cu_seqlens[i + 2]]
        assert layout.ids[keys].tolist() == sequence
        suffix = slice(layout.cu_seqlens[i + 1], layout.cu_seqlens[i + 2])
        assert layout.ids[suffix].tolist() == sequence[40:]
        assert layout.positions[suffix].tolist() == list(range(40, len(sequence)))
        # A suffix's queries are the last of its keys: a causal mask aligned to the end.
        assert (keys[-(len(sequence) - 40) :] == np.arange(suffix.start, suffix.stop)).all()
    assert layout.positions[:40].tolist() == list(range(40))
    assert layout.key_rows[: layout.key_cu_seqlens[1]].tolist() == list(range(40))


def test_each_sequence_keeps_a_token_of_its_own_and_short_prefixes_are_not_shared() -> None:
    same = list(range(50))
    assert common_prefix(*packed([same, same + [7], same])) == 49
    assert shared_prefix(*packed([same, same])).prefix == 49
    assert shared_prefix(*packed([same])) is None  # one sequence: nothing to share
    assert shared_prefix(*packed([list(range(31)) + [1, 2], list(range(31)) + [3]])) is None
    assert common_prefix(*packed([[1, 2, 3], [1, 2, 4], [9]])) == 0
