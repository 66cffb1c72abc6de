"""ROSE, the Runtime-Optimized Serving Engine: embedding models over packed ragged batches.

Its folders follow the engine's architecture: `serving/` (the engine, its step and start-up),
`runtime/` (CUDA graphs, device buffers, the driver and NVRTC), `loading/` (model folders,
weights, prestart), `models/` (the families and pooling), `attention/` (the backends), `ops/`
(ROSE's Triton kernels), `decoder/` (the fused single-query decoders).

Its names are imported on first use, so that a server can run rose.loading.prestart (the CUDA
context, Triton's key) while the main thread imports torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rose.loading.model_dir import ModelDir, default_model_path
    from rose.serving.engine import Engine
    from rose.serving.lazy import LazyTensor

__all__ = ["Engine", "LazyTensor", "ModelDir", "default_model_path"]
_HOMES = {
    "Engine": "rose.serving.engine",
    "LazyTensor": "rose.serving.lazy",
    "ModelDir": "rose.loading.model_dir",
    "default_model_path": "rose.loading.model_dir",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rose' has no attribute {name!r}")
