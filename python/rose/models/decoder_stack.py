"""The decoder stack that ROSE's decoder families share (Qwen3, Qwen2, Mistral/Llama), as an
embedding model over one packed ragged batch: RMSNorm, fused QKV (with a bias where the checkpoint
has one), RoPE, optional per-head QK-norm (Qwen3's), SwiGLU, and the final norm. A family is a
subclass naming what it has."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rose.attention import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.layers import Linear, Weights, add_linear_rmsnorm, swiglu
from rose.ops import kernels
from rose.ops.fused_swiglu import GatedProduct


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear  # q, k and v projections fused at load time
    q_norm: torch.Tensor | None  # Qwen3's per-head norms; None where the family has none
    k_norm: torch.Tensor | None
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # gate and up projections fused at load time
    down: Linear


def rope_theta(config: dict) -> float:
    """rope_theta at the top level of config.json, or inside rope_parameters (transformers 5)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise ModelError(f"RoPE scaling {rope_type!r} is not supported")
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


class DecoderStack:
    """A decoder stack: final-normed token states for every token of the batch."""

    weight_prefixes = ("model.",)
    qk_norm = False
    """Whether each layer norms q and k per head before RoPE (Qwen3)."""
    fused_swiglu: GatedProduct | None = None
    """The gate/up product with SwiGLU in its epilogue, once the engine has loaded it."""

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        matmul_dtype: torch.dtype | None = None,
    ) -> None:
        self.hidden = config["hidden_size"]
        self.eps = config.get("rms_norm_eps", 1e-6)
        heads, kv_heads = (
            config["num_attention_heads"],
            config.get("num_key_value_heads", config["num_attention_heads"]),
        )
        head_dim = config.get("head_dim") or self.hidden // heads
        causal = not config.get("use_bidirectional_attention", False)
        self.attention_spec = AttentionSpec(heads, kv_heads, head_dim, causal=causal)
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.rope = kernels.rope_cache(
            head_dim, config.get("max_position_embeddings", 32768), rope_theta(config), device
        )

        w = Weights(weights, dtype, device, matmul_dtype or dtype)
        linear = w.linear

        self.embed_tokens = w("embed_tokens.weight")
        self.norm = w("norm.weight")
        self.layers = []
        for i in range(config["num_hidden_layers"]):
            p = f"layers.{i}"
            self.layers.append(
                _Layer(
                    input_norm=w(f"{p}.input_layernorm.weight"),
                    qkv=linear([f"{p}.self_attn.{n}_proj" for n in "qkv"]),
                    q_norm=w(f"{p}.self_attn.q_norm.weight") if self.qk_norm else None,
                    k_norm=w(f"{p}.self_attn.k_norm.weight") if self.qk_norm else None,
                    o=linear([f"{p}.self_attn.o_proj"]),
                    post_norm=w(f"{p}.post_attention_layernorm.weight"),
                    gate_up=linear([f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"]),
                    down=linear([f"{p}.mlp.down_proj"]),
                )
            )

    @property
    def swiglu_shape(self) -> tuple[int, int]:
        """The fused gate/up weight's shape [2 * intermediate, hidden] (rose.ops.fused_swiglu)."""
        return tuple(self.layers[0].gate_up.weight.shape)

    def forward(
        self, batch: RaggedBatch, attention: AttentionBackend, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states after the final norm, or only `rows`' states
        (the last layer's work past attention done for those rows alone)."""
        spec = self.attention_spec
        residual = self.embed_tokens[batch.input_ids]  # the gather's own copy, added to in place
        h = kernels.rmsnorm(residual, self.layers[0].input_norm, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(h)
            out = None
            if layer.q_norm is not None:  # QK-norm, RoPE and attention in one launch where it can
                out = attention.norm_rope_attention(qkv, layer.q_norm, layer.k_norm, self.eps, self.rope)
            if out is None:
                q, k = self._rotated(qkv, layer, batch)
                v = qkv[:, self.q_size + self.kv_size :].reshape(-1, spec.num_kv_heads, spec.head_dim)
                out = attention(q, k, v)
            if rows is not None and layer is self.layers[-1]:
                out, residual = out[rows], residual[rows]
            h = add_linear_rmsnorm(layer.o, out.reshape(-1, self.q_size), residual, layer.post_norm, self.eps)
            after = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            h = add_linear_rmsnorm(layer.down, swiglu(layer.gate_up, h, self.fused_swiglu), residual, after, self.eps)
        return h

    def _rotated(self, qkv: torch.Tensor, layer: _Layer, batch: RaggedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """q [tokens, heads, dim] and k [tokens, kv_heads, dim] out of the fused projection, normed
        per head where the family does it, and rotated by RoPE."""
        spec = self.attention_spec
        if layer.q_norm is not None:
            return kernels.qk_norm_rope(
                qkv, layer.q_norm, layer.k_norm, self.eps, batch.positions, self.rope, spec.num_heads,
                spec.num_kv_heads,
            )  # fmt: skip
        q = qkv[:, : self.q_size].reshape(-1, spec.num_heads, spec.head_dim).contiguous()
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(-1, spec.num_kv_heads, spec.head_dim).contiguous()
        kernels.apply_rope(q, k, batch.positions, self.rope)
        return q, k
