"""SPLADE: a masked-LM head over every token's state, log(1 + relu(logits)) pooled per sequence
into one vocabulary-wide vector (sentence-transformers' MLMTransformer + SpladePooling)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.layers import ACTIVATIONS

TOKENS_A_CHUNK = 1024
"""Tokens whose vocabulary logits exist at once: [1,024 x vocabulary], never the whole batch's."""


class SpladeHead:
    """BertForMaskedLM's prediction head (dense, activation, LayerNorm, the decoder tied to the
    word embeddings unless the checkpoint has its own) and SPLADE's pooling."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        config: dict,
        strategy: str,
        activation: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
            raise ModelError(f"SpladePooling {strategy!r} with {activation!r} is not supported")
        p = "cls.predictions."
        missing = [n for n in (f"{p}transform.dense.weight", f"{p}bias") if n not in weights]
        if missing:
            raise ModelError(f"a SPLADE model needs its masked-LM head; the checkpoint has no {missing[0]}")

        def get(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype).contiguous()

        self.dense, self.dense_bias = get(f"{p}transform.dense.weight"), get(f"{p}transform.dense.bias")
        self.norm = (get(f"{p}transform.LayerNorm.weight"), get(f"{p}transform.LayerNorm.bias"))
        decoder = f"{p}decoder.weight" if f"{p}decoder.weight" in weights else "embeddings.word_embeddings.weight"
        self.decoder, self.bias = get(decoder), get(f"{p}bias")
        self.activation = ACTIVATIONS[config.get("hidden_act", "gelu")]
        self.eps = config.get("layer_norm_eps", 1e-12)
        self.strategy, self.twice = strategy, activation == "log1p_relu"
        self.vocab_size = self.decoder.shape[0]

    def __call__(self, hidden: torch.Tensor, batch: RaggedBatch) -> torch.Tensor:
        """[tokens, hidden] -> [sequences, vocabulary] float32."""
        out = torch.zeros(batch.num_sequences, self.vocab_size, device=hidden.device, dtype=torch.float32)
        for start in range(0, hidden.shape[0], TOKENS_A_CHUNK):
            h = hidden[start : start + TOKENS_A_CHUNK]
            h = self.activation(F.linear(h, self.dense, self.dense_bias))
            h = F.layer_norm(h, (h.shape[-1],), *self.norm, self.eps)
            logits = F.linear(h, self.decoder, self.bias).float()
            rows = batch.seq_ids[start : start + TOKENS_A_CHUNK]
            if self.strategy == "max":
                # log1p and relu are monotonic: the max of the logits first, the activation once after.
                out.scatter_reduce_(0, rows[:, None].expand_as(logits), logits, "amax", include_self=True)
            else:
                out.index_add_(0, rows, self._activate(logits))
        return self._activate(out) if self.strategy == "max" else out

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.log1p(torch.relu(x))
        return torch.log1p(x) if self.twice else x
