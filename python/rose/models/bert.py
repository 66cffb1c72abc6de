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
from rose.models.layers import ACTIVATIONS, Linear, Weights, activated
from rose.ops import kernels


@dataclass
class _Layer:
    qkv: Linear  # query, key and value fused at load time
    out: Linear
    attn_norm: tuple[torch.Tensor, torch.Tensor]
    up: Linear
    down: Linear
    ffn_norm: tuple[torch.Tensor, torch.Tensor]


class Bert:
    """BertModel's encoder: token states for every token of the batch."""

    weight_prefixes = ("bert.", "model.")
    layer_names = {
        "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
        "out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "up": "intermediate.dense",
        "down": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    """Where a layer's weights sit under `encoder.layer.N.` (families with BERT's layer rename them)."""
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
        self.activation = config.get("hidden_act", "gelu")
        if self.activation not in ACTIVATIONS:
            raise ModelError(f"activation {self.activation!r} is not supported")
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
        # MPNet has none.
        self.token_type_embeddings = self.token_type_embedding = None
        if "embeddings.token_type_embeddings.weight" in w:
            self.token_type_embeddings = w("embeddings.token_type_embeddings.weight")
            self.token_type_embedding = self.token_type_embeddings[0]
        self.embed_norm = norm("embeddings.LayerNorm")
        self.layers = []
        names = self.layer_names
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            self.layers.append(
                _Layer(
                    qkv=linear([f"{p}.{n}" for n in names["qkv"]]),
                    out=linear([f"{p}.{names['out']}"]),
                    attn_norm=norm(f"{p}.{names['attn_norm']}"),
                    up=linear([f"{p}.{names['up']}"]),
                    down=linear([f"{p}.{names['down']}"]),
                    ffn_norm=norm(f"{p}.{names['ffn_norm']}"),
                )
            )

    def forward(
        self, batch: RaggedBatch, attention: AttentionBackend, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states, or only `rows`' states (the last layer's work
        past attention done for those rows alone)."""
        spec = self.attention_spec
        positions = batch.positions + self.position_offset if self.position_offset else batch.positions
        x = self.word_embeddings[batch.input_ids] + self.position_embeddings[positions]
        if batch.token_type_ids is not None and self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings[batch.token_type_ids]
        elif self.token_type_embedding is not None:
            x = x + self.token_type_embedding
        x = F.layer_norm(x, (self.hidden,), *self.embed_norm, self.eps)
        for layer in self.layers:
            qkv = layer.qkv(x).view(-1, 3, spec.num_heads, spec.head_dim)
            attn = attention(qkv[:, 0], qkv[:, 1], qkv[:, 2]).reshape(-1, self.hidden)
            if rows is not None and layer is self.layers[-1]:
                attn, x = attn[rows], x[rows]
            x = kernels.add_layernorm(layer.out(attn), x, *layer.attn_norm, self.eps)
            h = activated(layer.up, x, self.activation)
            x = kernels.add_layernorm(layer.down(h), x, *layer.ffn_norm, self.eps)
        return x

    @staticmethod
    def score_head(weights: dict[str, torch.Tensor], tokenizer: object, config: dict) -> TanhClassifier:
        """BertForSequenceClassification's pooler and classifier."""
        return TanhClassifier(
            weights["pooler.dense.weight"], weights["pooler.dense.bias"],
            weights["classifier.weight"], weights["classifier.bias"],
        )  # fmt: skip
