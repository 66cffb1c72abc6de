"""torch.nn.attention.varlen.varlen_attn: PyTorch's own ragged attention kernel."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rose.attention.base import AttentionSpec, BackendUnavailable, OffsetsOnDeviceBackend


class TorchVarlenBackend(OffsetsOnDeviceBackend):
    """varlen_attn has no GQA argument: key and value heads are repeated to the query heads."""

    name = "torch"
    takes_window = True

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.require_cuda(self.name, device, spec, (8, 0))
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError as why:
            raise BackendUnavailable(f"this torch ({torch.__version__}) has no varlen_attn") from why
        self._attend: Callable = varlen_attn
        self._window = (-1, 0) if spec.causal else (-1, -1)
        # The kernel's own window: keys at most `window` before and after each query.
        self._local = (spec.window, 0 if spec.causal else spec.window) if spec.window is not None else self._window
        self._groups = spec.num_heads // spec.num_kv_heads

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windowed: bool = False) -> torch.Tensor:
        q, k, v = (t.contiguous() for t in (q, k, v))  # views into the fused QKV projection
        if self._groups > 1:
            k, v = (t.repeat_interleave(self._groups, dim=1) for t in (k, v))
        cu, longest = self.batch.cu_seqlens, self.batch.max_seqlen
        window = self._local if windowed else self._window
        return self._attend(q, k, v, cu, cu, longest, longest, scale=self.spec.scale, window_size=window)
