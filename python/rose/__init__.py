"""ROSE, the Runtime-Optimized Serving Engine: embedding models over packed ragged batches."""

from rose.engine import Engine
from rose.lazy import LazyTensor
from rose.model_dir import ModelDir, default_model_path

__all__ = ["Engine", "LazyTensor", "ModelDir", "default_model_path"]
