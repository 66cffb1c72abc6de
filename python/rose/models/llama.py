"""Mistral and Llama decoder embedders (e5-mistral, SFR-Embedding, Linq-Embed): the shared decoder
stack without biases or QK-norm; last-token pooling with their instruction prompts. A sliding
window shorter than the model's limit is refused (its masks are not built here)."""

from __future__ import annotations

from rose.errors import ModelError
from rose.models.decoder_stack import DecoderStack


class Llama(DecoderStack):
    """LlamaModel and MistralModel."""

    def __init__(self, config: dict, *args: object, **kwargs: object) -> None:
        window = config.get("sliding_window")
        if window and window < int(config.get("max_position_embeddings") or 0):
            raise ModelError(f"a sliding window of {window} tokens is not supported for {config.get('model_type')}")
        super().__init__(config, *args, **kwargs)
