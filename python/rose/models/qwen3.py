"""The Qwen3 family as embedding models over one packed ragged batch: the causal kind
(Qwen3-Embedding: last-token pooling, instruction prompts), the bidirectional kind of pplx-embed
(`use_bidirectional_attention`, mean pooling), and Qwen3-Reranker (a score head)."""

from __future__ import annotations

from typing import Any

import torch

from rose.decoder.base import DecoderWeights
from rose.errors import ModelError
from rose.models.decoder_stack import DecoderStack
from rose.models.heads import RowScore


class Qwen3(DecoderStack):
    """Qwen3Model: the shared decoder stack with per-head QK-norm."""

    qk_norm = True
    score_pooling = "last"
    """A causal reranker judges a pair at its last token."""

    def decoder_weights(self) -> DecoderWeights:
        """What a fused decoder (rose.decoder) runs this model's single queries from."""
        return DecoderWeights(self.layers, self.embed_tokens, self.rope, self.norm, self.attention_spec, self.eps)

    @staticmethod
    def score_head(weights: dict[str, torch.Tensor], tokenizer: Any, config: dict) -> RowScore:
        """Qwen3-Reranker's score, sigmoid(logit_yes - logit_no) at the last token: the difference
        of the LM head's rows of the tokenizer's "yes" and "no" (the embedding's rows when the head
        is tied to it)."""
        ids = [tokenizer.token_to_id(word) for word in ("yes", "no")]
        if None in ids:
            raise ModelError('the tokenizer has no "yes" or "no" token: not a Qwen3-Reranker')
        head = weights.get("lm_head.weight", weights["embed_tokens.weight"])
        return RowScore(head[ids[0]].float() - head[ids[1]].float())
