"""The decoder embedders on Qwen3's shared stack, in-process on the CPU: Qwen2 (QKV biases),
Mistral and Llama, each against Hugging Face transformers in float32 with last-token pooling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from support import DECODER_FAMILIES, QWEN3_SEQUENCES, cosines, save_decoder, transformers_pooled


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_decoder_embedders_match_transformers(tmp_path: Path, family: str) -> None:
    folder = save_decoder(tmp_path / family, family)
    engine = rose.Engine(folder, device="cpu")
    assert engine.pooling == "last" and engine.model_dir.model_type == family
    ours = engine.embed_ids(QWEN3_SEQUENCES)
    expected = transformers_pooled(folder, QWEN3_SEQUENCES).numpy()
    assert cosines(ours, expected).min() >= 0.9999
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-3)


def test_a_mistral_sliding_window_shorter_than_the_limit_is_refused(tmp_path: Path) -> None:
    import json

    folder = save_decoder(tmp_path / "mistral", "mistral")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    with pytest.raises(rose.errors.ModelError, match="sliding window of 64 tokens"):
        rose.Engine(folder, device="cpu")
