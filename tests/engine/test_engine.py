"""ROSE in-process on real model folders: the engine against sentence-transformers and Hugging
Face transformers, and its start-up fidelity check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import rose
from rose.serving import fidelity
from rose.serving.dtypes import cpu_has_bfloat16
from support import cosines, encode, save_tiny_bert, transformers_pooled

CHECKED = "mixed" if cpu_has_bfloat16() else "bfloat16"
"""A 16-bit CPU path the start-up check runs over: `mixed` serves float32 on a CPU without
bfloat16 instructions (nothing to check), plain bfloat16 still runs there, only slower."""


@pytest.fixture(scope="module")
def engine() -> rose.Engine:
    return rose.Engine(device="cpu")


def test_minilm_matches_sentence_transformers(engine: rose.Engine, texts: list[str], reference: np.ndarray) -> None:
    vectors = encode(engine, texts)
    sims = cosines(vectors, reference)
    assert sims.min() >= 0.9999, f"worst text: {texts[int(sims.argmin())]!r} at cosine {sims.min()}"


@pytest.mark.skipif(not cpu_has_bfloat16(), reason="mixed serves float32 on a CPU without bfloat16 instructions")
def test_mixed_dtype_stays_within_the_threshold(texts: list[str], reference: np.ndarray) -> None:
    vectors = encode(rose.Engine(device="cpu", dtype="mixed"), texts)
    assert cosines(vectors, reference).min() >= 0.9999


def test_batching_does_not_change_vectors(engine: rose.Engine, texts: list[str]) -> None:
    whole = encode(engine, texts)
    one_by_one = np.concatenate([encode(engine, [t]) for t in texts[:40]])
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
    assert d["fused_decoder"] == "off" and d["normalize_by_default"]
    tokenizer, template = engine.tokenization()
    assert json.loads(tokenizer)["model"]["type"] == "WordPiece"
    assert json.loads(template)["max_input_length"] == 256


@pytest.mark.parametrize("pooling, prefix", [("cls", ""), ("mean", "bert.")])
def test_bert_variants_match_transformers_fp32(tmp_path: Path, pooling: str, prefix: str) -> None:
    # The same random weights twice: ours with the name prefix under test, plain for transformers.
    save_tiny_bert(tmp_path / "ours", pooling, prefix)
    save_tiny_bert(tmp_path / "hf", pooling)
    engine = rose.Engine(tmp_path / "ours", device="cpu")
    assert engine.pooling == pooling
    sequences = [[101, 2023, 2003, 102], [101, 7592, 102], [101] + list(range(1000, 1100)) + [102]]
    ours = engine.embed_ids(sequences)
    expected = transformers_pooled(tmp_path / "hf", sequences).numpy()
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours, expected, atol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_an_xlm_roberta_embedder_matches_transformers(tmp_path: Path, pooling: str) -> None:
    """The bge-m3 / multilingual-e5 kind: XLMRobertaModel's encoder, positions after the padding id."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(5)
    config = XLMRobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                              vocab_size=30522, max_position_embeddings=514, type_vocab_size=1)  # fmt: skip
    model = XLMRobertaModel(config).eval()
    folder = tmp_path / "xlmr"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((rose.default_model_path() / "tokenizer.json").read_bytes())
    (folder / "1_Pooling").mkdir()
    key = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}[pooling]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({key: True}))
    engine = rose.Engine(folder, device="cpu")
    assert engine.max_input_length == 512 and engine.describe()["task"] == "embed"
    sequences = [[101, 2023, 2003, 102], [101] + list(range(1000, 1500)) + [102], [7592]]
    with torch.no_grad():
        states = [model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in sequences]
    expected = np.stack([(h[0] if pooling == "cls" else h.mean(0)).numpy() for h in states])
    assert cosines(engine.embed_ids(sequences), expected).min() >= 0.9999


def test_fidelity_check_passes_a_16_bit_path_and_refuses_a_diverging_one() -> None:
    engine = rose.Engine(device="cpu", dtype=CHECKED)
    assert engine.fidelity["worst_cosine"] >= 0.999 and not engine.fidelity["fallbacks"]
    strict = engine.check_fidelity(threshold=1.01)
    assert strict["fallbacks"] and strict["fallbacks"][0]["path"].startswith(f"sdpa, {CHECKED}")
    assert strict["worst_cosine"] < strict["threshold"]


def test_a_cpu_engine_is_checked_unless_it_is_float32_throughout(tmp_path: Path) -> None:
    folder = save_tiny_bert(tmp_path / "bert", "mean")
    assert rose.Engine(folder, device="cpu").fidelity is None  # the reference's own arithmetic
    report = rose.Engine(folder, device="cpu", dtype="bfloat16").fidelity
    assert report is not None and report["path"].startswith("sdpa, bfloat16")
    assert report["worst_cosine"] >= fidelity.THRESHOLD and not report["fallbacks"]


def test_large_steps_are_checked_against_the_same_reference() -> None:
    # The check an engine runs when large steps change path (the fused SwiGLU): the fixed
    # sequences repeated into one batch, each copy against the reference's vectors.
    engine = rose.Engine(device="cpu", dtype=CHECKED)
    verdict = engine.startup.check_large(4096, "large")
    lengths = sum(min(n, engine.max_input_length) for n in fidelity.LENGTHS)
    copies = -(-4096 // lengths)
    assert verdict.passed and verdict.sequences == copies * len(fidelity.LENGTHS)
    report = engine.fidelity["large_batches"]
    assert report["path"] == "large" and report["worst_cosine"] == verdict.worst_cosine >= 0.999
    engine.startup.threshold = 1.01
    assert not engine.startup.check_large(4096, "large").passed
    assert rose.Engine(device="cpu").startup.check_large(4096, "large") is None  # float32 checks nothing


def test_the_fidelity_reference_is_kept_for_the_next_start_with_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROSE_CACHE_DIR", str(tmp_path / "cache"))
    folder = save_tiny_bert(tmp_path / "bert", "mean")

    def start() -> rose.Engine:
        return rose.Engine(folder, device="cpu", dtype=CHECKED)

    first, second = start(), start()
    assert (first.fidelity["reference"], second.fidelity["reference"]) == ("computed", "stored")
    np.testing.assert_array_equal(first.startup._expected[1], second.startup._expected[1])
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
