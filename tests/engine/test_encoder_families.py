"""The encoder families beyond BERT, in-process on the CPU against sentence-transformers in float32
on texts that include a 1-token input, inputs past MPNet's bucket distance (128 tokens) and a
batch mixing lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from support import EMBEDDINGGEMMA_PROMPTS, cosines, encode, save_embeddinggemma, save_modernbert, save_mpnet

TEXTS = [
    "a",
    "MPNet adds a relative position bias to every layer's attention scores.",
    # ~450 tokens: past MPNet's 384 (truncated) and its bucket distance, and past ModernBERT's window.
    " ".join(f"word{i}" for i in range(150)),
    "short",
    "The quick brown fox jumps over the lazy dog. " * 12,
]


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)


def test_mpnet_matches_sentence_transformers(tmp_path: Path) -> None:
    folder = save_mpnet(tmp_path / "mpnet")
    engine = rose.Engine(folder, device="cpu")
    assert engine.model_dir.model_type == "mpnet" and engine.pooling == "mean"
    ours = encode(engine, TEXTS)  # pooled; Tulip normalizes
    expected = reference(folder, TEXTS)
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours / np.linalg.norm(ours, axis=1, keepdims=True), expected, atol=1e-4)
    # One at a time: the same vectors as in the mixed batch.
    alone = np.concatenate([encode(engine, [t]) for t in TEXTS])
    np.testing.assert_allclose(alone, ours, atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_matches_sentence_transformers(tmp_path: Path, pooling: str) -> None:
    folder = save_modernbert(tmp_path / f"modernbert-{pooling}", pooling)
    engine = rose.Engine(folder, device="cpu")
    assert engine.model_dir.model_type == "modernbert" and engine.pooling == pooling
    ours = encode(engine, TEXTS)
    expected = reference(folder, TEXTS)
    assert cosines(ours, expected).min() >= 0.9999
    alone = np.concatenate([encode(engine, [t]) for t in TEXTS])
    np.testing.assert_allclose(alone, ours, atol=1e-5)


def test_embeddinggemma_matches_sentence_transformers_with_its_prompts(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = save_embeddinggemma(tmp_path / "embeddinggemma")
    engine = rose.Engine(folder, device="cpu")
    assert engine.model_dir.model_type == "gemma3_text" and engine.dimensions == 64
    assert engine.model_dir.modules == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    assert engine.model_dir.prompts == EMBEDDINGGEMMA_PROMPTS
    st = SentenceTransformer(str(folder), device="cpu")
    for name, prompt in EMBEDDINGGEMMA_PROMPTS.items():
        expected = st.encode(TEXTS, prompt_name=name, convert_to_numpy=True)
        ours = encode(engine, [prompt + t for t in TEXTS])
        assert cosines(ours, expected).min() >= 0.9999, name
