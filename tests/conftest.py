"""Shared fixtures: a real `ivy-serve` process on free loopback ports, and reference vectors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from support import Server, start_server, varied_texts


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """ivy-serve with no model flag: the default all-MiniLM-L6-v2, on the CPU, truncating long
    inputs unless a request says otherwise (as sentence-transformers does)."""
    running = start_server(tmp_path_factory.mktemp("logs"), "--auto-truncate")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def texts() -> list[str]:
    return varied_texts()


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import rose

    return rose.default_model_path()


@pytest.fixture(scope="session")
def reference(texts: list[str], minilm_path: Path) -> np.ndarray:
    """sentence-transformers' own encode of `texts` (normalized, as the model's modules say)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path), device="cpu")
    return model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=400,
        help="generated HTTP bodies, and as many gRPC messages, in tests/e2e/test_fuzz.py (the long run: 10000)",
    )
