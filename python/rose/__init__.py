"""ROSE, the Runtime-Optimized Serving Engine: embedding models over packed ragged batches.

Its names are imported on first use, so that a server can run `rose.prestart` (the CUDA
context, Triton's key) while the main thread imports torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rose.engine import Engine
    from rose.lazy import LazyTensor
    from rose.model_dir import ModelDir, default_model_path

__all__ = ["Engine", "LazyTensor", "ModelDir", "default_model_path"]
_HOMES = {
    "Engine": "rose.engine",
    "LazyTensor": "rose.lazy",
    "ModelDir": "rose.model_dir",
    "default_model_path": "rose.model_dir",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rose' has no attribute {name!r}")
