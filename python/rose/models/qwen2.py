"""Qwen2 decoder embedders (gte-Qwen2, stella): the shared decoder stack with QKV biases (read from
the checkpoint) and no QK-norm; last-token pooling with their instruction prompts."""

from __future__ import annotations

from rose.models.decoder_stack import DecoderStack


class Qwen2(DecoderStack):
    """Qwen2Model."""
