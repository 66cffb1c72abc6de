"""Small building blocks shared by the model definitions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Linear:
    """A dense layer. Its matmul may run in a narrower dtype than the activations (the `mixed`
    dtype: bfloat16 matmuls with float32 accumulation, float32 everywhere else), which on CPUs
    with bfloat16 instructions is the fastest setting that stays within 1e-4 of float32."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, matmul_dtype: torch.dtype
    ) -> None:
        self.weight = weight.to(matmul_dtype).contiguous()
        self.bias = None if bias is None else bias.to(dtype).contiguous()
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == self.dtype:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x.to(self.weight.dtype), self.weight).to(self.dtype)
        return y if self.bias is None else y.add_(self.bias)
