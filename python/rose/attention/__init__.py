"""Attention backends over ragged batches, chosen by name or automatically."""

from __future__ import annotations

import logging

import torch

from rose.attention.base import AttentionBackend, AttentionSpec, BackendUnavailable
from rose.attention.sdpa import SdpaBackend

__all__ = ["AttentionBackend", "AttentionSpec", "BackendUnavailable", "create_backend", "BACKENDS"]

log = logging.getLogger(__name__)

BACKENDS: dict[str, type[AttentionBackend]] = {"sdpa": SdpaBackend}


def create_backend(name: str, spec: AttentionSpec, device: torch.device) -> AttentionBackend:
    """The backend `name` ("auto" picks the best one that loads here)."""
    if name != "auto":
        if name not in BACKENDS:
            raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(BACKENDS)}")
        return BACKENDS[name](spec, device)
    reasons = []
    for candidate in _auto_order(device):
        try:
            return BACKENDS[candidate](spec, device)
        except BackendUnavailable as why:
            reasons.append(f"{candidate}: {why}")
            log.info("attention backend %s unavailable: %s", candidate, why)
    raise BackendUnavailable("no attention backend can run here: " + "; ".join(reasons))


def _auto_order(device: torch.device) -> list[str]:
    return ["sdpa"] if device.type == "cpu" else [n for n in BACKENDS if n != "sdpa"]
