"""ModernBERT (ModernBertModel, and ModernBertForSequenceClassification as a score model): a
pre-norm encoder with RoPE, global attention every few layers and a sliding window on the others
(each kind with its own RoPE base), GeGLU, and norms without bias."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rose.attention import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.layers import ACTIVATIONS, Linear, Weights, rope_bases, sliding_layers
from rose.ops import kernels


@dataclass
class _Layer:
    attn_norm: tuple[torch.Tensor, torch.Tensor | None] | None  # None: the first layer has none
    qkv: Linear
    out: Linear
    mlp_norm: tuple[torch.Tensor, torch.Tensor | None]
    up: Linear  # GeGLU's input and gate, in that order
    down: Linear
    local: bool  # within the sliding window, with the local RoPE base


class ModernBert:
    """ModernBertModel's encoder: final-normed token states for every token of the batch."""

    weight_prefixes = ("model.",)
    score_pooling = "cls"
    """The classifier's pooling when config.json names none (its head says which: `pooling`)."""

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        matmul_dtype: torch.dtype | None = None,
    ) -> None:
        self.hidden = config["hidden_size"]
        self.eps = config.get("norm_eps", 1e-5)
        self.activation = ACTIVATIONS[config.get("hidden_activation", "gelu")]
        heads = config["num_attention_heads"]
        head_dim = self.hidden // heads
        # `local_attention` is the window's whole width: half of it on each side of a query.
        window = int(config.get("local_attention", 128)) // 2
        self.attention_spec = AttentionSpec(heads, heads, head_dim, causal=False, window=window)
        longest = int(config.get("max_position_embeddings", 8192))
        global_theta, local_theta = rope_bases(config, ("global_rope_theta", "local_rope_theta"), (160000.0, 10000.0))
        self.rope_global = kernels.rope_cache(head_dim, longest, global_theta, device)
        self.rope_local = kernels.rope_cache(head_dim, longest, local_theta, device)

        w = Weights(weights, dtype, device, matmul_dtype or dtype)

        def norm(prefix: str) -> tuple[torch.Tensor, torch.Tensor | None]:
            return w(f"{prefix}.weight"), w(f"{prefix}.bias") if f"{prefix}.bias" in w else None

        self.embeddings = w("embeddings.tok_embeddings.weight")
        self.embed_norm = norm("embeddings.norm")
        self.final_norm = norm("final_norm")
        self.layers = []
        # Older configs: every layer but each `global_attn_every_n_layers`-th is local.
        every = int(config.get("global_attn_every_n_layers", 3))
        for i, local in enumerate(sliding_layers(config, lambda i: bool(i % every))):
            p = f"layers.{i}"
            self.layers.append(
                _Layer(
                    attn_norm=norm(f"{p}.attn_norm") if f"{p}.attn_norm.weight" in w else None,
                    qkv=w.linear([f"{p}.attn.Wqkv"]),
                    out=w.linear([f"{p}.attn.Wo"]),
                    mlp_norm=norm(f"{p}.mlp_norm"),
                    up=w.linear([f"{p}.mlp.Wi"]),
                    down=w.linear([f"{p}.mlp.Wo"]),
                    local=local,
                )
            )
        if len(self.layers) != config["num_hidden_layers"]:
            raise ModelError(f"layer_types names {len(self.layers)} layers, not {config['num_hidden_layers']}")

    def _norm(self, x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden,), norm[0], norm[1], self.eps)

    def forward(
        self, batch: RaggedBatch, attention: AttentionBackend, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states, or only `rows`' states (the last layer's work
        past attention done for those rows alone)."""
        spec = self.attention_spec
        x = self._norm(self.embeddings[batch.input_ids], self.embed_norm)
        for layer in self.layers:
            h = x if layer.attn_norm is None else self._norm(x, layer.attn_norm)
            qkv = layer.qkv(h).view(-1, 3, spec.num_heads, spec.head_dim)
            # RoPE rotates q and k in place, which the GPU's kernel does on contiguous tensors.
            q, k, v = qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2]
            kernels.apply_rope(q, k, batch.positions, self.rope_local if layer.local else self.rope_global)
            attn = attention(q, k, v, windowed=layer.local).reshape(-1, self.hidden)
            if rows is not None and layer is self.layers[-1]:
                attn, x = attn[rows], x[rows]
            x = x + layer.out(attn)
            gate_in, gate = layer.up(self._norm(x, layer.mlp_norm)).chunk(2, dim=-1)
            x = x + layer.down(self.activation(gate_in) * gate)
        return self._norm(x, self.final_norm)

    @staticmethod
    def score_head(weights: dict[str, torch.Tensor], tokenizer: object, config: dict) -> ModernBertHead:
        """ModernBertForSequenceClassification's head and classifier."""
        return ModernBertHead(weights, config)


class ModernBertHead:
    """logits = classifier(norm(act(dense(pooled)))), in float32 (ModernBertPredictionHead), of
    the first token's state or the mean of all (`classifier_pooling`)."""

    def __init__(self, weights: dict[str, torch.Tensor], config: dict) -> None:
        get = lambda name: weights[name].float().contiguous() if name in weights else None  # noqa: E731
        self.dense, self.dense_bias = weights["head.dense.weight"].float().contiguous(), get("head.dense.bias")
        self.norm, self.norm_bias = get("head.norm.weight"), get("head.norm.bias")
        self.out, self.out_bias = weights["classifier.weight"].float().contiguous(), get("classifier.bias")
        self.activation = ACTIVATIONS[config.get("classifier_activation", "gelu")]
        self.eps = config.get("norm_eps", 1e-5)
        self.pooling = config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise ModelError(f"classifier_pooling {self.pooling!r} is not supported; supported: cls, mean")

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        hidden = self.activation(F.linear(pooled, self.dense, self.dense_bias))
        hidden = F.layer_norm(hidden, (hidden.shape[-1],), self.norm, self.norm_bias, self.eps)
        return F.linear(hidden, self.out, self.out_bias)
