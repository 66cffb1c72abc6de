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
from rose.ops import fused_qk_rope, kernels
from rose.ops.fused_qk_rope import FusedQkv, QkvProduct, QkvShape
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
    fused_qkv: FusedQkv | None = None
    """The QKV product with QK-norm and RoPE in its epilogue, once the engine has loaded it."""

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
        theta = rope_theta(config)
        self.rope = kernels.rope_cache(head_dim, config.get("max_position_embeddings", 32768), theta, device)
        self.inv_freq = kernels.rope_inv_freq(head_dim, theta)

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

    @property
    def qkv_shape(self) -> QkvShape | None:
        """The attention projection, where rose.ops.fused_qk_rope can fuse its QK-norm and RoPE (a
        16-bit product without a bias); else None."""
        qkv = self.layers[0].qkv
        if not self.qk_norm or not isinstance(qkv, Linear) or not qkv.plain or qkv.bias is not None:
            return None
        spec = self.attention_spec
        return QkvShape(spec.num_heads, spec.num_kv_heads, spec.head_dim, self.hidden, self.eps)

    def use_fused_qkv(self, product: QkvProduct | None) -> None:
        """Large steps take `product` (bound to the layers' weight copies), or the unfused path."""
        self.fused_qkv = None
        if product is not None:
            layers = [(layer.qkv.weight, layer.q_norm, layer.k_norm) for layer in self.layers]
            self.fused_qkv = FusedQkv(product, self.qkv_shape, self.inv_freq, layers)

    def forward(
        self, batch: RaggedBatch, attention: AttentionBackend, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states after the final norm, or only `rows`' states
        (the last layer's work past attention done for those rows alone)."""
        residual = self.embed_tokens[batch.input_ids]  # the gather's own copy, added to in place
        h = kernels.rmsnorm(residual, self.layers[0].input_norm, self.eps)
        fused_qkv = self.fused_qkv if batch.num_tokens >= fused_qk_rope.MIN_TOKENS else None
        positions = batch.positions.float() if fused_qkv is not None else None
        for i, layer in enumerate(self.layers):
            out = self._attention(i, h, batch, attention, fused_qkv, positions)
            if rows is not None and layer is self.layers[-1]:
                out, residual = out[rows], residual[rows]
            h = add_linear_rmsnorm(layer.o, out.reshape(-1, self.q_size), residual, layer.post_norm, self.eps)
            after = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            h = add_linear_rmsnorm(layer.down, swiglu(layer.gate_up, h, self.fused_swiglu), residual, after, self.eps)
        return h

    def _attention(self, i: int, h: torch.Tensor, batch: RaggedBatch, attention: AttentionBackend,
                   fused_qkv: FusedQkv | None, positions: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """Layer i's attention over its normed input h: [tokens, heads, dim]."""
        spec, layer = self.attention_spec, self.layers[i]
        if fused_qkv is not None:  # q and k come normed and rotated, in pair order
            qkv = fused_qkv(i, h, positions)
            return attention(*(qkv[:, a:b].unflatten(1, (-1, spec.head_dim)) for a, b in self._qkv_columns))
        qkv = layer.qkv(h)
        if layer.q_norm is not None:  # QK-norm, RoPE and attention in one launch where it can
            out = attention.norm_rope_attention(qkv, layer.q_norm, layer.k_norm, self.eps, self.rope)
            if out is not None:
                return out
        q, k = self._rotated(qkv, layer, batch)
        v = qkv[:, self.q_size + self.kv_size :].reshape(-1, spec.num_kv_heads, spec.head_dim)
        return attention(q, k, v)

    @property
    def _qkv_columns(self) -> tuple[tuple[int, int], ...]:
        """Where q, k and v lie in the fused projection's columns."""
        qk = self.q_size + self.kv_size
        return (0, self.q_size), (self.q_size, qk), (qk, qk + self.kv_size)

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
