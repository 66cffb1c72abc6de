"""FlashAttention 4 (CuTe DSL) over ragged sequences."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rose.attention.base import AttentionBackend, AttentionSpec, BackendUnavailable
from rose.batch import RaggedBatch


class FlashAttention4Backend(AttentionBackend):
    """flash_attn.cute.flash_attn_varlen_func; GQA natively."""

    name = "fa4"

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.require_cuda(self.name, device, spec, (9, 0))
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError as why:
            raise BackendUnavailable(f"flash-attn-4 does not import: {why}") from why
        self._attend: Callable = flash_attn_varlen_func
        self._cu_seqlens = torch.zeros(1, dtype=torch.int32, device=device)
        self._max_seqlen = 0

    def plan(self, batch: RaggedBatch) -> None:
        self._cu_seqlens = batch.cu_seqlens
        self._max_seqlen = batch.max_seqlen

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, _ = self._attend(
            q,
            k,
            v,
            cu_seqlens_q=self._cu_seqlens,
            cu_seqlens_k=self._cu_seqlens,
            max_seqlen_q=self._max_seqlen,
            max_seqlen_k=self._max_seqlen,
            softmax_scale=self.spec.scale,
            causal=self.spec.causal,
        )
        return out
