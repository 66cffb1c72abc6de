"""The CPU's attention (SDPA over padded length groups) and pooling against plain references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose.attention import AttentionSpec, create_backend
from rose.attention.sdpa import length_groups
from rose.batch import RaggedBatch
from rose.models.pooling import pool

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "lengths, expected",
    [
        ([5], [[0]]),
        ([100, 100, 100], [[0, 1, 2]]),
        ([200, 10, 190, 12], [[0, 2], [3, 1]]),
        ([3, 1, 2], [[0, 2, 1]]),  # tiny sequences share one padded call
    ],
)
def test_length_groups_bound_padding(lengths: list[int], expected: list[list[int]]) -> None:
    assert length_groups(lengths) == expected


def test_length_groups_cover_every_sequence_once() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 512, size=300).tolist()
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(300))
    for g in groups:
        padded = max(lengths[i] for i in g) * len(g)
        assert padded <= 64 or padded <= 1.25 * sum(lengths[i] for i in g)


def reference_attention(q, k, v, cu, causal):
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for s, e in zip(cu[:-1], cu[1:], strict=False):
        qs, ks, vs = q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        scores = qs @ ks.transpose(1, 2) / q.shape[-1] ** 0.5
        if causal:
            scores = scores.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        out[s:e] = (scores.softmax(-1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_sdpa_backend_matches_attention_per_sequence(causal: bool, heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    lengths = [1, 17, 3, 64, 65, 2, 40, 40, 7]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    batch = RaggedBatch.from_host(np.zeros(cu[-1], dtype=np.int32), cu, CPU)
    q = torch.randn(cu[-1], heads, 32)
    k, v = torch.randn(cu[-1], kv_heads, 32), torch.randn(cu[-1], kv_heads, 32)
    backend = create_backend("sdpa", AttentionSpec(heads, kv_heads, 32, causal), CPU)
    backend.plan(batch)
    expected = reference_attention(q, k, v, cu.tolist(), causal)
    torch.testing.assert_close(backend(q, k, v), expected, atol=1e-5, rtol=1e-5)


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: auto, sdpa"):
        create_backend("flash9", AttentionSpec(1, 1, 32, False), CPU)


def test_pooling_modes() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)
    batch = RaggedBatch.from_host([0] * 6, [0, 1, 4, 6], CPU)
    torch.testing.assert_close(pool(hidden, batch, "cls"), hidden[[0, 1, 4]])
    torch.testing.assert_close(pool(hidden, batch, "last"), hidden[[0, 3, 5]])
    torch.testing.assert_close(
        pool(hidden, batch, "mean"), torch.stack([hidden[0], hidden[1:4].mean(0), hidden[4:].mean(0)])
    )


def test_max_and_weighted_mean_pooling_follow_sentence_transformers() -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    lengths = [3, 1, 5]
    hidden = torch.randn(sum(lengths), 4)
    batch = RaggedBatch.from_host([0] * sum(lengths), np.concatenate([[0], np.cumsum(lengths)]), CPU)
    padded = torch.zeros(3, 5, 4)
    mask = torch.zeros(3, 5)
    for i, (start, n) in enumerate(zip(np.cumsum([0, *lengths[:-1]]), lengths, strict=True)):
        padded[i, :n], mask[i, :n] = hidden[start : start + n], 1
    for mode in ("max", "weightedmean"):
        st = Pooling(4, pooling_mode=mode)
        expected = st({"token_embeddings": padded, "attention_mask": mask})["sentence_embedding"]
        torch.testing.assert_close(pool(hidden, batch, mode), expected)
