"""ROSE in-process: the engine against sentence-transformers and Hugging Face transformers."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import rose
from models import save_tiny_bert, transformers_pooled
from rose import fidelity
from rose.attention import AttentionSpec, create_backend
from rose.attention.sdpa import length_groups
from rose.batch import RaggedBatch
from rose.graphs import bucket, sequence_slots, token_bucket
from rose.pooling import pool, quantize_binary, quantize_int8, shape_vectors
from support import cosines

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def engine() -> rose.Engine:
    return rose.Engine(device="cpu")


def test_minilm_matches_sentence_transformers(engine: rose.Engine, texts: list[str], reference: np.ndarray) -> None:
    vectors = engine.encode(texts)
    sims = cosines(vectors, reference)
    assert sims.min() >= 0.9999, f"worst text: {texts[int(sims.argmin())]!r} at cosine {sims.min()}"


def test_mixed_dtype_stays_within_the_threshold(texts: list[str], reference: np.ndarray) -> None:
    vectors = rose.Engine(device="cpu", dtype="mixed").encode(texts)
    assert cosines(vectors, reference).min() >= 0.9999


def test_batching_does_not_change_vectors(engine: rose.Engine, texts: list[str]) -> None:
    whole = engine.encode(texts, max_batch_tokens=1 << 20)
    one_by_one = np.concatenate([engine.encode([t]) for t in texts[:40]])
    assert cosines(whole[:40], one_by_one).min() >= 0.99999


def test_step_returns_a_lazy_tensor_of_pooled_vectors(engine: rose.Engine) -> None:
    ids = np.array([101, 7592, 102, 101, 2088, 2003, 102], dtype=np.int32)
    lazy = engine.step(ids.tobytes(), np.array([0, 3, 7], dtype=np.int32).tobytes())
    assert isinstance(lazy, rose.LazyTensor)
    assert lazy.ready()
    out = lazy.wait()
    assert out.dtype == np.float32 and out.shape == (2, 384)
    # Unnormalized: the caller shapes the vectors.
    assert not np.allclose(np.linalg.norm(out, axis=1), 1.0)


def test_describe_reports_what_tulip_needs(engine: rose.Engine) -> None:
    d = engine.describe()
    assert d["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert (d["dimensions"], d["max_input_length"], d["vocab_size"]) == (384, 256, 30522)
    assert (d["device"], d["dtype"], d["attention_backend"], d["pooling"]) == ("cpu", "float32", "sdpa", "mean")
    assert json.loads(d["tokenizer_json"])["model"]["type"] == "WordPiece"


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


def test_matryoshka_truncation_then_normalization() -> None:
    v = torch.tensor([[3.0, 4.0, 12.0]])
    torch.testing.assert_close(shape_vectors(v, 2), torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(shape_vectors(v, None, normalize=False), v)
    with pytest.raises(ValueError, match="between 1 and 3"):
        shape_vectors(v, 4)


def test_quantization_matches_tulip_encodings() -> None:
    v = torch.tensor([[0.0, 10.0, -10.0, 0.5, 1.0, -1.0, 1.0, 1.0, -1.0, 2.0]])
    assert quantize_int8(v)[0, :4].tolist() == [0, 127, -127, round(np.tanh(0.5) * 127)]
    assert quantize_binary(v)[0].tolist() == [0b01011011, 0b01000000]


@pytest.mark.parametrize("pooling, prefix", [("cls", ""), ("mean", "bert.")])
def test_bert_variants_match_transformers_fp32(tmp_path: Path, pooling: str, prefix: str) -> None:
    # The same random weights twice: ours with the name prefix under test, plain for transformers.
    save_tiny_bert(tmp_path / "ours", pooling, prefix)
    save_tiny_bert(tmp_path / "hf", pooling)
    engine = rose.Engine(tmp_path / "ours", device="cpu")
    assert engine.pooling == pooling
    sequences = [[101, 2023, 2003, 102], [101, 7592, 102], [101] + list(range(1000, 1100)) + [102]]
    ours = engine.embed_ids(sequences, normalize=False)
    expected = transformers_pooled(tmp_path / "hf", sequences).numpy()
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours, expected, atol=1e-4)


@pytest.mark.parametrize(
    "tokens, expected",
    [(1, 64), (64, 64), (65, 128), (1000, 1024), (1024, 1024), (1025, 1280), (16384, 16384), (16385, 16640)],
)
def test_token_buckets_are_multiples_of_64_then_256(tokens: int, expected: int) -> None:
    assert token_bucket(tokens) == expected


def test_sequence_slots_keep_one_for_the_padding() -> None:
    assert [sequence_slots(n) for n in (1, 2, 3, 4, 5, 9, 512)] == [1, 2, 4, 4, 8, 16, 512]
    assert bucket(16, 1) == (64, 2) and bucket(64, 7) == (64, 8) and bucket(300, 8) == (320, 16)
    assert bucket(16, 1, smallest=16) == (16, 2) and bucket(17, 1, smallest=16) == (64, 2)


def test_fidelity_check_passes_the_mixed_path_and_refuses_a_diverging_one() -> None:
    engine = rose.Engine(device="cpu", dtype="mixed")
    assert engine.fidelity["worst_cosine"] >= 0.999 and not engine.fidelity["fallbacks"]
    strict = engine.check_fidelity(threshold=1.01)
    assert strict["fallbacks"] and strict["fallbacks"][0]["path"].startswith("sdpa, mixed")


def test_the_fidelity_reference_is_kept_for_the_next_start_with_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROSE_CACHE_DIR", str(tmp_path / "cache"))
    folder = save_tiny_bert(tmp_path / "bert", "mean")

    def start() -> rose.Engine:
        return rose.Engine(folder, device="cpu", dtype="mixed")

    first, second = start(), start()
    assert (first.fidelity["reference"], second.fidelity["reference"]) == ("computed", "stored")
    np.testing.assert_array_equal(first._expected[1], second._expected[1])
    assert second.fidelity["worst_cosine"] == first.fidelity["worst_cosine"] >= 0.999
    # New weights in place: the stored vectors no longer hold.
    weights = folder / "model.safetensors"
    later = weights.stat().st_mtime_ns + 10**9
    os.utime(weights, ns=(later, later))
    assert start().fidelity["reference"] == "computed"
    # A damaged file is computed again, not trusted.
    for stored in (tmp_path / "cache" / "fidelity").glob("*.npy"):
        stored.write_bytes(b"not an array")
    assert start().fidelity["reference"] == "computed"


def test_the_fidelity_check_runs_single_queries_alone_short_batches_together_and_then_everything() -> None:
    fixed = fidelity.sequences(1000, 512)

    def lengths(smallest: int | None, tier: str) -> list[list[int]]:
        engine = types.SimpleNamespace(smallest_bucket=smallest)
        return [[len(s) for s in fixed[part]] for part in fidelity.tier_batches(engine, fixed, tier)]

    assert lengths(16, "single") == [[1], [3], [8], [16]]
    assert lengths(None, "single") == []
    assert lengths(16, "short") == [[1, 3, 8, 16, 17], [17]]  # up to 64 tokens, and the longest alone
    assert lengths(16, "long") == [list(fidelity.LENGTHS)]
    with pytest.raises(ValueError, match="unknown tier"):
        lengths(16, "medium")
