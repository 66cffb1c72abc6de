"""The encoder families on the GPU in bfloat16 against sentence-transformers in float32 on the CPU
(cosine >= 0.999, the GPU issue's bound), through every attention backend that loads for the
model (ModernBERT's and EmbeddingGemma's windows on the backends that take one); the decoder
families (Qwen2, Mistral, Llama) against transformers the same way; the ModernBERT
cross-encoder's probabilities within 1e-2 of CrossEncoder.predict's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_scoring import DOCS, QUERY, in_order

import rose
from rose.attention import BACKENDS, BackendUnavailable
from support import (
    DECODER_FAMILIES,
    QWEN3_SEQUENCES,
    cosines,
    encode,
    pair_ids,
    save_cross_encoder,
    save_decoder,
    save_embeddinggemma,
    save_modernbert,
    save_mpnet,
    transformers_pooled,
)

TEXTS = ["a", "a short query", " ".join(f"word{i}" for i in range(150)), "The quick brown fox. " * 20]
FAMILIES: dict[str, Callable[[Path], Path]] = {
    "mpnet": save_mpnet,
    "modernbert": lambda folder: save_modernbert(folder, "mean"),
    "embeddinggemma": save_embeddinggemma,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_families_in_bf16_match_float32(tmp_path: Path, family: str, backend: str) -> None:
    from sentence_transformers import SentenceTransformer

    folder = FAMILIES[family](tmp_path / family)
    try:
        engine = rose.Engine(folder, device="cuda", attention_backend=backend)
    except BackendUnavailable as why:
        pytest.skip(f"{backend} does not serve {family}: {why}")
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    for _ in range(3):  # eager, capture, replay where the backend is captured
        assert cosines(encode(engine, TEXTS), expected).min() >= 0.999
    assert engine.fidelity["worst_cosine"] >= 0.999


@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_decoder_families_in_bf16_match_float32(tmp_path: Path, family: str, backend: str) -> None:
    folder = save_decoder(tmp_path / family, family)
    try:
        engine = rose.Engine(folder, device="cuda", attention_backend=backend)
    except BackendUnavailable as why:
        pytest.skip(f"{backend} does not serve {family}: {why}")
    expected = transformers_pooled(folder, QWEN3_SEQUENCES).numpy()
    for _ in range(3):  # eager, capture, replay
        assert cosines(engine.embed_ids(QWEN3_SEQUENCES), expected).min() >= 0.999
    assert engine.fidelity["worst_cosine"] >= 0.999


def test_a_modernbert_cross_encoder_in_bf16_matches_cross_encoder_predict(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    folder = save_cross_encoder(tmp_path / "modernbert", "modernbert")
    engine = rose.Engine(folder, device="cuda")
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, d) for d in DOCS])

    pairs = [pair_ids(folder, QUERY, d, engine.max_input_length)[0] for d in DOCS]
    lengths = np.array([len(ids) for ids in pairs])
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    logits = engine.step(np.concatenate(pairs).astype(np.int32), cu).wait()[:, 0]
    in_order(1 / (1 + np.exp(-logits)), expected)
