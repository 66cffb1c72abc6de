"""The BERT family (MiniLM, BGE, E5, GTE-base style BertModel) over one packed ragged batch, and
its cross-encoders (BertForSequenceClassification: the pooler and the classifier as a score head)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rose.attention import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.heads import TanhClassifier
from rose.models.layers import Linear, Weights


@dataclass
class _Layer:
    qkv: Linear  # query, key and value fused at load time
    out: Linear
    attn_norm: tuple[torch.Tensor, torch.Tensor]
    up: Linear
    down: Linear
    ffn_norm: tuple[torch.Tensor, torch.Tensor]


_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class Bert:
    """BertModel's encoder: token states for every token of the batch."""

    weight_prefixes = ("bert.", "model.")
    score_pooling = "cls"
    """A cross-encoder scores a pair from its first token's state."""
    position_offset = 0
    """Where positions start in the position embeddings (RoBERTa's start after its padding id)."""

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        matmul_dtype: torch.dtype | None = None,
    ) -> None:
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError("only absolute position embeddings are supported for BERT models")
        self.hidden = config["hidden_size"]
        self.eps = config.get("layer_norm_eps", 1e-12)
        self.activation = _ACTIVATIONS[config.get("hidden_act", "gelu")]
        heads = config["num_attention_heads"]
        self.attention_spec = AttentionSpec(heads, heads, self.hidden // heads, causal=False)

        w = Weights(weights, dtype, device, matmul_dtype or dtype)
        linear = w.linear

        def norm(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
            # Older checkpoints name LayerNorm's parameters gamma and beta.
            gamma = f"{prefix}.weight" if f"{prefix}.weight" in w else f"{prefix}.gamma"
            beta = f"{prefix}.bias" if f"{prefix}.bias" in w else f"{prefix}.beta"
            return w(gamma), w(beta)

        self.word_embeddings = w("embeddings.word_embeddings.weight")
        self.position_embeddings = w("embeddings.position_embeddings.weight")
        # Token types (segments): a pair's second part is type 1; a batch without them is all type 0.
        self.token_type_embeddings = w("embeddings.token_type_embeddings.weight")
        self.token_type_embedding = self.token_type_embeddings[0]
        self.embed_norm = norm("embeddings.LayerNorm")
        self.layers = []
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            self.layers.append(
                _Layer(
                    qkv=linear([f"{p}.attention.self.{n}" for n in ("query", "key", "value")]),
                    out=linear([f"{p}.attention.output.dense"]),
                    attn_norm=norm(f"{p}.attention.output.LayerNorm"),
                    up=linear([f"{p}.intermediate.dense"]),
                    down=linear([f"{p}.output.dense"]),
                    ffn_norm=norm(f"{p}.output.LayerNorm"),
                )
            )

    def forward(self, batch: RaggedBatch, attention: AttentionBackend) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states."""
        spec = self.attention_spec
        types = self.token_type_embedding
        if batch.token_type_ids is not None:
            types = self.token_type_embeddings[batch.token_type_ids]
        positions = batch.positions + self.position_offset if self.position_offset else batch.positions
        x = self.word_embeddings[batch.input_ids] + self.position_embeddings[positions] + types
        x = F.layer_norm(x, (self.hidden,), *self.embed_norm, self.eps)
        for layer in self.layers:
            qkv = layer.qkv(x).view(-1, 3, spec.num_heads, spec.head_dim)
            attn = attention(qkv[:, 0], qkv[:, 1], qkv[:, 2]).reshape(-1, self.hidden)
            x = F.layer_norm(layer.out(attn).add_(x), (self.hidden,), *layer.attn_norm, self.eps)
            h = self.activation(layer.up(x))
            x = F.layer_norm(layer.down(h).add_(x), (self.hidden,), *layer.ffn_norm, self.eps)
        return x

    @staticmethod
    def score_head(weights: dict[str, torch.Tensor], tokenizer: object) -> TanhClassifier:
        """BertForSequenceClassification's pooler and classifier."""
        return TanhClassifier(
            weights["pooler.dense.weight"], weights["pooler.dense.bias"],
            weights["classifier.weight"], weights["classifier.bias"],
        )  # fmt: skip
