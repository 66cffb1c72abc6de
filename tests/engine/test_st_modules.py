"""sentence-transformers modules as published: Pooling, then Dense modules (with their
activations) and Normalize after it, against sentence-transformers' own encode; a module ROSE does
not run is refused at start, by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import rose
from rose.errors import ModelError
from support import cosines, encode, save_tiny_bert, varied_texts


def save_with_dense(folder: Path) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    base = save_tiny_bert(folder.parent / "base", "mean")
    torch.manual_seed(7)
    transformer = Transformer(str(base))
    modules = [transformer, Pooling(64, "mean"), Dense(64, 96, activation_function=torch.nn.Tanh()),
               Dense(96, 48, activation_function=torch.nn.Identity()), Normalize()]  # fmt: skip
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def test_dense_modules_and_normalize_follow_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = save_with_dense(tmp_path / "dense")
    engine = rose.Engine(folder, device="cpu")
    assert engine.dimensions == 48 and engine.describe()["dimensions"] == 48
    assert engine.describe()["normalize_by_default"]
    assert engine.describe()["modules"] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    texts = varied_texts(60)
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert cosines(encode(engine, texts), expected).min() >= 0.9999


def test_an_unsupported_module_is_refused_by_name(tmp_path: Path) -> None:
    folder = save_tiny_bert(tmp_path / "bert", "mean")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_CNN", "type": "sentence_transformers.models.CNN"}]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelError, match=r"module sentence_transformers\.models\.CNN, which is not supported; "
                                         r"supported: Transformer, Pooling, Dense, Normalize"):  # fmt: skip
        rose.Engine(folder, device="cpu")
