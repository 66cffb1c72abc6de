"""The Qwen3 family as embedding models, over one packed ragged batch: the causal kind
(Qwen3-Embedding: last-token pooling, instruction prompts) and the bidirectional kind of
pplx-embed (`use_bidirectional_attention`, mean pooling)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rose import kernels
from rose.attention import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch
from rose.layers import Linear, Weights
from rose.pooling import pool

if TYPE_CHECKING:
    from rose.cuda_decoder import CudaDecoder
    from rose.fused_decoder import FusedDecoder

log = logging.getLogger(__name__)


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear  # q, k and v projections fused at load time
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # gate and up projections fused at load time
    down: Linear


def rope_theta(config: dict) -> float:
    """rope_theta at the top level of config.json, or inside rope_parameters (transformers 5)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported")
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


class Qwen3:
    """Qwen3Model's decoder stack: final-normed token states for every token of the batch."""

    weight_prefixes = ("model.",)

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
                    q_norm=w(f"{p}.self_attn.q_norm.weight"),
                    k_norm=w(f"{p}.self_attn.k_norm.weight"),
                    o=linear([f"{p}.self_attn.o_proj"]),
                    post_norm=w(f"{p}.post_attention_layernorm.weight"),
                    gate_up=linear([f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"]),
                    down=linear([f"{p}.mlp.down_proj"]),
                )
            )
        self.fused = self._fused_decoder(dtype, matmul_dtype or dtype, device)

    def _fused_decoder(
        self, dtype: torch.dtype, matmul_dtype: torch.dtype, device: torch.device
    ) -> CudaDecoder | FusedDecoder | None:
        """The layers as one launch for short batches, on a GPU in 16-bit: the CUDA kernel where it
        fits (Qwen3-0.6B's sizes on Hopper), else the Triton one where Triton runs.
        ROSE_FUSED_DECODER=0 turns both off, =triton the CUDA one (for comparisons). The CUDA one
        takes the layers' weights over only once its kernel is loaded, so a failure leaves them as
        they were for the Triton one."""
        choice = os.environ.get("ROSE_FUSED_DECODER", "auto")
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or matmul_dtype != dtype:
            return None
        if choice == "0" or torch.cuda.get_device_capability(device) < (8, 0):
            return None
        if choice != "triton":
            from rose import cuda_decoder, nvrtc
            from rose.cuda_driver import CudaError

            try:
                return cuda_decoder.CudaDecoder(self.layers, self.attention_spec, self.eps, device)
            except (ValueError, OSError, CudaError, nvrtc.NvrtcError) as why:
                log.info("the CUDA decoder does not serve this model here: %s", why)
        tr = kernels.triton_kernels()
        # Its attention is norm_rope_attention's, with the same limits on the head dim.
        if tr is None or not tr.fits_norm_rope_attention(self.attention_spec.head_dim):
            return None
        from rose import fused_decoder

        try:
            return fused_decoder.FusedDecoder(self.layers, self.attention_spec, self.eps, device)
        except ValueError:
            return None

    def pooled(self, batch: RaggedBatch, attention: AttentionBackend, pooling: str) -> torch.Tensor:
        """[tokens] ids -> [sequences, hidden] float32 vectors pooled by `pooling` (rose.pooling's
        modes): in one launch where the CUDA decoder takes the batch, else forward(), then pool."""
        if self.fused is not None and self.fused.pools and batch.num_tokens <= self.fused.max_tokens:
            return self.fused(batch, self.embed_tokens, self.rope, self.norm, pooling)
        return pool(self.forward(batch, attention), batch, pooling)

    def forward(self, batch: RaggedBatch, attention: AttentionBackend) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden] states after the final norm."""
        spec = self.attention_spec
        if self.fused is not None and not self.fused.pools and batch.num_tokens <= self.fused.max_tokens:
            x = self.embed_tokens[batch.input_ids].float()
            self.fused(x, batch, self.rope)
            return kernels.rmsnorm(x.to(self.norm.dtype), self.norm, self.eps)
        x = self.embed_tokens[batch.input_ids]
        residual = x.clone()
        h = kernels.rmsnorm(x, self.layers[0].input_norm, self.eps)
        for i, layer in enumerate(self.layers):
            if i > 0:
                h = kernels.add_rmsnorm(x, residual, layer.input_norm, self.eps)
            qkv = layer.qkv(h)
            out = attention.norm_rope_attention(qkv, layer.q_norm, layer.k_norm, self.eps, self.rope)
            if out is None:
                q, k = kernels.qk_norm_rope(
                    qkv, layer.q_norm, layer.k_norm, self.eps, batch.positions, self.rope, spec.num_heads,
                    spec.num_kv_heads,
                )  # fmt: skip
                v = qkv[:, self.q_size + self.kv_size :].reshape(-1, spec.num_kv_heads, spec.head_dim)
                out = attention(q, k, v)
            x = layer.o(out.reshape(-1, self.q_size))
            h = kernels.add_rmsnorm(x, residual, layer.post_norm, self.eps)
            x = layer.down(kernels.silu_and_mul(layer.gate_up(h)))
        return kernels.add_rmsnorm(x, residual, self.norm, self.eps)
