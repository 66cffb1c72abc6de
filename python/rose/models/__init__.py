"""Model registry: which class runs which `model_type` of config.json."""

from __future__ import annotations

from rose.models.bert import Bert
from rose.models.qwen3 import Qwen3

MODELS: dict[str, type] = {
    "bert": Bert,
    "qwen3": Qwen3,
}


def model_class(model_type: str) -> type:
    """The class that runs `model_type`; says which types are known when it is not."""
    try:
        return MODELS[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type!r} is not supported; supported: {', '.join(MODELS)}") from None
