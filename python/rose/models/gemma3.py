"""Gemma3 text encoders (EmbeddingGemma: Gemma3TextModel with `use_bidirectional_attention`):
local layers within a sliding window and a global one every few, each kind with its own RoPE
base; QK-norm; the (1 + w) RMSNorm before and after attention and the MLP; the embedding scaled by
sqrt(hidden); GeGLU with the tanh GELU. sentence-transformers' Dense modules and prompts come from
the folder as for any model (rose.loading.model_dir)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rose.attention import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.layers import Linear, Weights, rope_bases, sliding_layers
from rose.ops import kernels


@dataclass
class _Layer:
    input_norm: torch.Tensor  # each norm's (1 + w), made at load
    qkv: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    out: Linear
    post_attn_norm: torch.Tensor
    pre_mlp_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    post_mlp_norm: torch.Tensor
    local: bool


class Gemma3:
    """Gemma3TextModel: final-normed token states for every token of the batch."""

    weight_prefixes = ("model.",)

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        matmul_dtype: torch.dtype | None = None,
    ) -> None:
        if dtype == torch.float16:
            # Gemma's residual stream outgrows float16's range; bfloat16 has float32's.
            raise ModelError("Gemma3 models overflow in float16: serve them in bfloat16 or float32")
        if config.get("attn_logit_softcapping"):
            raise ModelError("Gemma3's attention logit soft-capping is not supported")
        self.hidden = config["hidden_size"]
        self.eps = config.get("rms_norm_eps", 1e-6)
        heads, kv_heads = (
            config["num_attention_heads"],
            config.get("num_key_value_heads", config["num_attention_heads"]),
        )
        head_dim = config.get("head_dim") or self.hidden // heads
        bidirectional = bool(config.get("use_bidirectional_attention"))
        # With bidirectional attention the reference reads `sliding_window` as the window's whole
        # width: keys at most sliding_window // 2 away on either side (Gemma3TextConfig).
        sliding = int(config.get("sliding_window") or 4096)
        window = sliding // 2 if bidirectional else sliding - 1
        scale = float(config.get("query_pre_attn_scalar") or head_dim) ** -0.5
        self.attention_spec = AttentionSpec(
            heads, kv_heads, head_dim, causal=not bidirectional, window=window, softmax_scale=scale
        )
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        longest = int(config.get("max_position_embeddings", 2048))
        global_theta, local_theta = rope_bases(config, ("rope_theta", "rope_local_base_freq"), (1e6, 1e4))
        self.rope_global = kernels.rope_cache(head_dim, longest, global_theta, device)
        self.rope_local = kernels.rope_cache(head_dim, longest, local_theta, device)

        w = Weights(weights, dtype, device, matmul_dtype or dtype)
        # The embedding's scale is rounded to the weights' dtype, as the reference rounds it.
        self.embed_scale = torch.tensor(self.hidden**0.5, dtype=dtype).to(device)
        self.embed_tokens = w("embed_tokens.weight")
        gain = lambda name: (1.0 + w.tensors[name].float()).to(device=device, dtype=dtype)  # noqa: E731
        self.norm = gain("norm.weight")
        pattern = int(config.get("sliding_window_pattern", 6))
        self.layers = []
        for i, local in enumerate(sliding_layers(config, lambda i: bool((i + 1) % pattern))):
            p = f"layers.{i}"
            self.layers.append(
                _Layer(
                    input_norm=gain(f"{p}.input_layernorm.weight"),
                    qkv=w.linear([f"{p}.self_attn.{n}_proj" for n in "qkv"]),
                    q_norm=gain(f"{p}.self_attn.q_norm.weight"),
                    k_norm=gain(f"{p}.self_attn.k_norm.weight"),
                    out=w.linear([f"{p}.self_attn.o_proj"]),
                    post_attn_norm=gain(f"{p}.post_attention_layernorm.weight"),
                    pre_mlp_norm=gain(f"{p}.pre_feedforward_layernorm.weight"),
                    gate_up=w.linear([f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"]),
                    down=w.linear([f"{p}.mlp.down_proj"]),
                    post_mlp_norm=gain(f"{p}.post_feedforward_layernorm.weight"),
                    local=local,
                )
            )

    def _norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """Gemma's RMSNorm: the shared one with the (1 + w) gain made at load."""
        return kernels.rmsnorm(x, gain, self.eps)

    def forward(
        self, batch: RaggedBatch, attention: AttentionBackend, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states, or only `rows`' states (the last layer's work
        past attention done for those rows alone)."""
        spec = self.attention_spec
        x = self.embed_tokens[batch.input_ids] * self.embed_scale
        for layer in self.layers:
            qkv = layer.qkv(self._norm(x, layer.input_norm))
            q = self._norm(qkv[:, : self.q_size].view(-1, spec.num_heads, spec.head_dim), layer.q_norm)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(-1, spec.num_kv_heads, spec.head_dim)
            k = self._norm(k, layer.k_norm)
            v = qkv[:, self.q_size + self.kv_size :].view(-1, spec.num_kv_heads, spec.head_dim)
            kernels.apply_rope(q, k, batch.positions, self.rope_local if layer.local else self.rope_global)
            attn = attention(q, k, v, windowed=layer.local).reshape(-1, self.q_size)
            if rows is not None and layer is self.layers[-1]:
                attn, x = attn[rows], x[rows]
            x = x + self._norm(layer.out(attn), layer.post_attn_norm)
            gate, up = layer.gate_up(self._norm(x, layer.pre_mlp_norm)).chunk(2, dim=-1)
            x = x + self._norm(layer.down(F.gelu(gate, approximate="tanh") * up), layer.post_mlp_norm)
        return self._norm(x, self.norm)
