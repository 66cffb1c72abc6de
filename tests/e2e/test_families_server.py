"""Each model family served by a real ivy-serve and called with the OpenAI SDK: the vectors of
sentence-transformers (encoders, with their Dense modules and prompts) or of transformers' last
token (decoder embedders, sent as token ids) in float32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from support import (
    DECODER_FAMILIES,
    QWEN3_SEQUENCES,
    cosines,
    save_decoder,
    save_embeddinggemma,
    save_modernbert,
    save_mpnet,
    start_server,
    transformers_pooled,
    varied_texts,
)

ENCODERS: dict[str, Callable[[Path], Path]] = {
    "mpnet": save_mpnet,
    "modernbert": lambda folder: save_modernbert(folder, "cls"),
    "embeddinggemma": save_embeddinggemma,
}


def openai_vectors(url: str, inputs: list) -> np.ndarray:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    answer = client.embeddings.create(model="m", input=inputs)
    return np.array([d.embedding for d in answer.data], dtype=np.float32)


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_an_encoder_family_over_the_openai_sdk(tmp_path: Path, family: str) -> None:
    from sentence_transformers import SentenceTransformer

    folder = ENCODERS[family](tmp_path / family)
    texts = varied_texts(48)
    server = start_server(tmp_path, "--model", str(folder), "--auto-truncate")
    try:
        ours = openai_vectors(server.url, texts)
    finally:
        server.stop()
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
    worst = cosines(ours, expected)
    assert worst.min() >= 0.9999, texts[int(worst.argmin())]


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_a_decoder_family_over_the_openai_sdk(tmp_path: Path, family: str) -> None:
    folder = save_decoder(tmp_path / family, family)
    server = start_server(tmp_path, "--model", str(folder))
    try:
        ours = openai_vectors(server.url, QWEN3_SEQUENCES)
    finally:
        server.stop()
    assert cosines(ours, transformers_pooled(folder, QWEN3_SEQUENCES).numpy()).min() >= 0.9999
