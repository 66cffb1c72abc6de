"""FlashInfer's ragged prefill kernels (FA2 and, on Hopper, FA3), run with no KV cache at all."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rose import kernels
from rose.attention.base import AttentionBackend, AttentionSpec, BackendUnavailable
from rose.batch import RaggedBatch

_WORKSPACE_BYTES = 128 << 20
# FlashInfer compiles head dims 64, 128 and 256 only; smaller heads are zero-padded up to 64
# (the padded lanes add nothing to q.k, and the softmax scale stays the real head dim's).
_SMALLEST_HEAD_DIM = 64


class FlashInferBackend(AttentionBackend):
    """BatchPrefillWithRaggedKVCacheWrapper; planned on the host once per batch."""

    variant = "fa2"
    min_capability = (8, 0)

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.name = self.variant
        fi = kernels.flashinfer()
        if fi is None:
            raise BackendUnavailable("flashinfer is not installed (pip install flashinfer-python)")
        self.require_cuda(self.name, device, spec, self.min_capability)
        self.head_dim = max(spec.head_dim, _SMALLEST_HEAD_DIM)
        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = fi.prefill.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=self.variant)

    def plan(self, batch: RaggedBatch) -> None:
        indptr = batch.cu_seqlens_host
        self.wrapper.plan(
            indptr,
            indptr,
            self.spec.num_heads,
            self.spec.num_kv_heads,
            self.head_dim,
            causal=self.spec.causal,
            sm_scale=self.spec.scale,
            q_data_type=self.spec.dtype,
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))  # views into the fused QKV projection
        pad = self.head_dim - self.spec.head_dim
        if pad:
            q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        out = self.wrapper.run(q, k, v)
        return out[..., : self.spec.head_dim] if pad else out


class FlashInfer3Backend(FlashInferBackend):
    """FlashInfer's FA3 kernels, for Hopper."""

    variant = "fa3"
    min_capability = (9, 0)
