"""FlashAttention 4 (CuTe DSL) over ragged sequences."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from rose.attention.base import AttentionSpec, BackendUnavailable, OffsetsOnDeviceBackend
from rose.runtime.cache import cache_dir


class FlashAttention4Backend(OffsetsOnDeviceBackend):
    """flash_attn.cute.flash_attn_varlen_func; GQA natively."""

    name = "fa4"

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.require_cuda(self.name, device, spec, (9, 0))
        self.import_libraries()
        from flash_attn.cute import flash_attn_varlen_func

        self._attend: Callable = flash_attn_varlen_func

    @classmethod
    def import_libraries(cls) -> None:
        _keep_compiled_kernels()
        try:
            import flash_attn.cute  # noqa: F401
        except ImportError as why:
            raise BackendUnavailable(f"flash-attn-4 does not import: {why}") from why

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cu, longest = self.batch.cu_seqlens, self.batch.max_seqlen
        out, _ = self._attend(
            q,
            k,
            v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=longest,
            max_seqlen_k=longest,
            softmax_scale=self.spec.scale,
            causal=self.spec.causal,
        )
        return out


def _keep_compiled_kernels() -> None:
    """FA4 compiles its kernels at first use (seconds each) and by default keeps them in memory
    only, so every start compiled them again; like FlashInfer and Triton, keep them on disk."""
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(cache_dir("flash-attention-cute")))
