"""A causal reranker's pairs read their common head (template, instruction, query) once: the
scores are those of the plain path, on the CPU's backend as on FlashInfer's (tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from support import save_decoder, save_qwen3_reranker


def packed(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
    cu = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int32)
    return ids, cu


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_qwen3_reranker(tmp_path_factory.mktemp("reranker") / "qwen3-reranker")


def test_pairs_with_a_common_head_score_as_on_the_plain_path(reranker: Path) -> None:
    rng = np.random.default_rng(0)
    head = rng.integers(1000, 30000, 45).tolist()
    sequences = [head + rng.integers(1000, 30000, n).tolist() for n in (1, 3, 90, 17, 200, 64)]
    plain = rose.Engine(reranker, device="cpu", task="score", shared_prefix=False)
    shared = rose.Engine(reranker, device="cpu", task="score")
    want, got = plain.step(*packed(sequences)).wait(), shared.step(*packed(sequences)).wait()
    assert shared.prefix_steps == 1 and plain.prefix_steps == 0
    assert shared.stats()["shared_prefix"] == {"enabled": True, "steps": 1, "tokens_saved": 45 * 5}
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert np.ptp(want) > 0.1  # the scores differ, so a mix-up of rows would show
    # A head shorter than the threshold, or a single pair, takes the plain path.
    short = [s[40:] for s in sequences]
    np.testing.assert_allclose(shared.step(*packed(short)).wait(), plain.step(*packed(short)).wait(), atol=1e-5)
    shared.step(*packed(sequences[:1])).wait()
    assert shared.prefix_steps == 1


def test_only_causal_score_models_that_pool_the_last_token_share_a_prefix(reranker: Path, tmp_path: Path) -> None:
    assert rose.Engine(reranker, device="cpu", task="score").shared_prefix
    assert not rose.Engine(reranker, device="cpu", task="embed").shared_prefix
    assert not rose.Engine(save_decoder(tmp_path / "qwen2", "qwen2"), device="cpu").shared_prefix
