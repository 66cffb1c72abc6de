"""ROSE's Triton attention for small batches (online queries, at most 64 tokens in all): one
program per head over the whole packed batch, a block-diagonal mask keeping the sequences apart.
No host-side plan, and v is read where the fused projection left it."""

from __future__ import annotations

import torch

from rose.attention.base import AttentionSpec, BackendUnavailable, OffsetsOnDeviceBackend
from rose.ops import kernels


class SmallBatchBackend(OffsetsOnDeviceBackend):
    """rose.ops.triton_kernels.small_batch_attention, for batches of at most `max_tokens` tokens;
    AutoBackend sends it those."""

    name = "triton"

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.require_cuda(self.name, device, spec, (8, 0))
        self._kernels = kernels.triton_kernels()
        if self._kernels is None:
            raise BackendUnavailable("triton is not installed")
        self.max_tokens = self._kernels.SMALL_BATCH_TOKENS
        dim = spec.head_dim
        if dim < 16 or dim & (dim - 1):
            raise BackendUnavailable(f"head_dim {dim} is not a power of two of at least 16")
        if spec.num_heads % spec.num_kv_heads:
            raise BackendUnavailable(f"{spec.num_heads} heads do not share {spec.num_kv_heads} key-value heads evenly")
        # Whether QK-norm and RoPE can ride in the attention launch (norm_rope_attention).
        self._fuses_norm_rope = self._kernels.fits_norm_rope_attention(dim)

    def norm_rope_attention(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                            rope: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        # One launch where there were two: on a short query each launch a layer counts.
        if qkv.shape[0] > self.max_tokens or not self._fuses_norm_rope:
            return None
        spec, batch = self.spec, self.batch
        return self._kernels.norm_rope_attention(
            qkv, q_norm, k_norm, eps, batch.positions, rope, batch.seq_ids,
            spec.num_heads, spec.num_kv_heads, spec.causal, spec.scale,
        )  # fmt: skip

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[0] > self.max_tokens:
            raise ValueError(f"the {self.name} backend takes at most {self.max_tokens} tokens, not {q.shape[0]}")
        spec, seq_ids = self.spec, self.batch.seq_ids
        out = self._kernels.small_batch_attention(q.contiguous(), k.contiguous(), v, seq_ids, spec.causal, spec.scale)
        return out.view(q.shape)
