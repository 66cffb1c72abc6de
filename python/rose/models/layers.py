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


class Weights:
    """A checkpoint's tensors, moved to the model's device and dtype as the model takes them."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, matmul_dtype: torch.dtype
    ) -> None:
        self.tensors, self.dtype, self.device, self.matmul_dtype = tensors, dtype, device, matmul_dtype

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __call__(self, name: str) -> torch.Tensor:
        return self.tensors[name].to(device=self.device, dtype=self.dtype).contiguous()

    def linear(self, prefixes: list[str]) -> Linear:
        """The dense layers under `prefixes` fused into one (QKV, gate and up), with a bias when
        every part has one."""
        weight = torch.cat([self(f"{p}.weight") for p in prefixes])
        bias = None
        if all(f"{p}.bias" in self for p in prefixes):
            bias = torch.cat([self(f"{p}.bias") for p in prefixes])
        return Linear(weight, bias, self.dtype, self.matmul_dtype)
