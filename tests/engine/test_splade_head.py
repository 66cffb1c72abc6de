"""SPLADE's head in the engine: chunked over tokens (a sequence split across chunks, padding
slots left empty) as it is computed whole, and the folder's pooling read as published."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rose
from rose.errors import ModelError
from rose.models import sparse
from support import save_splade


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_splade(tmp_path_factory.mktemp("splade") / "splade")


def test_chunks_of_tokens_give_the_vectors_of_the_whole_batch(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = rose.Engine(folder, device="cpu")
    assert engine.pooling == "splade" and engine.dimensions == 30522
    sequences = [[101, *range(2000, 2000 + n), 102] for n in (3, 40, 1, 17)]
    whole = engine.embed_ids(sequences)
    monkeypatch.setattr(sparse, "TOKENS_A_CHUNK", 7)
    chunked = engine.embed_ids(sequences)
    assert np.allclose(chunked, whole, rtol=1e-6, atol=1e-7) and (whole > 0).any(axis=1).all()


def test_a_splade_model_without_its_head_is_refused(folder: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    bare = tmp_path / "bare"
    bare.mkdir()
    for f in folder.rglob("*"):
        if f.is_file():
            (bare / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (bare / f.relative_to(folder)).write_bytes(f.read_bytes())
    weights = {k: v for k, v in load_file(bare / "model.safetensors").items() if not k.startswith("cls.")}
    save_file(weights, str(bare / "model.safetensors"))
    with pytest.raises(ModelError, match="masked-LM head"):
        rose.Engine(bare, device="cpu")
