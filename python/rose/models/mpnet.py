"""MPNet (all-mpnet-base-v2's MPNetModel): BERT's post-norm layer under other names, positions
after the padding id, no token types, and a relative position bias shared by every layer
(T5-style buckets of the distance, one value a head), which goes to the attention backend as a
table by distance (rose.attention's `AttentionSpec.relative_bias`)."""

from __future__ import annotations

import dataclasses
import math

import torch

from rose.models.bert import Bert

MAX_DISTANCE = 128
"""The distance past which MPNet's buckets stop growing (the reference's constant)."""


def relative_bucket(relative: torch.Tensor, num_buckets: int = 32, max_distance: int = MAX_DISTANCE) -> torch.Tensor:
    """MPNet's bucket of each key-minus-query distance: half the buckets a direction, exact up to
    a quarter of them, logarithmic beyond (MPNetEncoder.relative_position_bucket)."""
    n = -relative
    half = num_buckets // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    far = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    far = torch.clamp(far, max=half - 1)
    return bucket + torch.where(n < exact, n, far)


class MPNet(Bert):
    """MPNetModel's encoder."""

    weight_prefixes = ("mpnet.", "model.")
    layer_names = {
        "qkv": ("attention.attn.q", "attention.attn.k", "attention.attn.v"),
        "out": "attention.attn.o",
        "attn_norm": "attention.LayerNorm",
        "up": "intermediate.dense",
        "down": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }

    def __init__(self, config: dict, weights: dict[str, torch.Tensor], *args: object, **kwargs: object) -> None:
        super().__init__(config, weights, *args, **kwargs)
        # Position ids start at padding_idx + 1, as RoBERTa's do.
        self.position_offset = int(config.get("pad_token_id", 1)) + 1
        buckets = int(config.get("relative_attention_num_buckets", 32))
        longest = int(config["max_position_embeddings"])
        # bias[h, d + longest - 1] for distance d = key - query in (-longest, longest).
        distances = torch.arange(-longest + 1, longest)
        table = weights["encoder.relative_attention_bias.weight"].to(self.word_embeddings.device, torch.float32)
        by_distance = table[relative_bucket(distances, buckets).to(table.device)].T.contiguous()
        bias = by_distance.to(self.word_embeddings.dtype)
        self.attention_spec = dataclasses.replace(self.attention_spec, relative_bias=bias)
