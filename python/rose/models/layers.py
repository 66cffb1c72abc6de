"""Small building blocks shared by the model definitions."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rose.errors import ModelError
from rose.ops import kernels
from rose.ops.fp8 import FP8, Fp8Linear
from rose.ops.fused_swiglu import MIN_TOKENS, GatedProduct

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
"""config.json's activation names, as transformers' ACT2FN computes them."""

_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


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

    @property
    def plain(self) -> bool:
        """Whether the matmul runs in the activations' dtype (so cuBLAS's epilogues apply)."""
        return self.weight.dtype == self.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.plain:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x.to(self.weight.dtype), self.weight).to(self.dtype)
        return y if self.bias is None else y.add_(self.bias)


def add_linear_rmsnorm(
    layer: Linear | Fp8Linear, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += layer(x), then returns RMSNorm(residual). On a GPU in 16 bits the add rides in
    the matmul (cuBLAS's C input with beta 1), which saves writing the product and reading it back."""
    if layer.bias is None and layer.plain and kernels.fuses_epilogues(x):
        residual.addmm_(x, layer.weight.t())
        return kernels.rmsnorm(residual, weight, eps)
    return kernels.add_rmsnorm(layer(x), residual, weight, eps)


def activated(layer: Linear | Fp8Linear, x: torch.Tensor, activation: str) -> torch.Tensor:
    """activation(layer(x)) for [tokens, features] x; on a GPU in 16 bits a GELU with a bias rides
    in the matmul's epilogue (cuBLASLt's GELU_BIAS). Its GELU is the tanh form, which differs from
    the exact one by < 5e-4, an order below bfloat16's rounding of the same values."""
    if activation in _GELUS and layer.bias is not None and layer.plain and kernels.fuses_epilogues(x):
        return torch._addmm_activation(layer.bias, x, layer.weight.t(), use_gelu=True)
    return ACTIVATIONS[activation](layer(x))


def swiglu(layer: Linear | Fp8Linear, x: torch.Tensor, fused: GatedProduct | None) -> torch.Tensor:
    """silu(gate) * up of the fused gate/up `layer`'s product with x [tokens, hidden]. A large
    step takes `fused` where the engine has loaded it (rose.ops.fused_swiglu): the activation in
    the GEMM's epilogue instead of a kernel of its own."""
    large = x.shape[0] >= MIN_TOKENS
    if fused is not None and large and layer.bias is None and layer.plain and kernels.fuses_epilogues(x):
        return fused(x, layer.weight)
    return kernels.silu_and_mul(layer(x))


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

    def linear(self, prefixes: list[str]) -> Linear | Fp8Linear:
        """The dense layers under `prefixes` fused into one (QKV, gate and up), with a bias when
        every part has one; an FP8 one when the matmuls' dtype is e4m3 (`--dtype fp8`)."""
        weight = torch.cat([self(f"{p}.weight") for p in prefixes])
        bias = None
        if all(f"{p}.bias" in self for p in prefixes):
            bias = torch.cat([self(f"{p}.bias") for p in prefixes])
        if self.matmul_dtype == FP8:
            return Fp8Linear(weight, bias, self.dtype)
        return Linear(weight, bias, self.dtype, self.matmul_dtype)


def sliding_layers(config: dict, sliding: Callable[[int], bool]) -> list[bool]:
    """Whether each layer attends within the sliding window: config.json's `layer_types`
    (transformers 5), else the family's rule `sliding(layer index)` for older configs."""
    types = config.get("layer_types")
    if types:
        return [kind == "sliding_attention" for kind in types]
    return [sliding(i) for i in range(config["num_hidden_layers"])]


def rope_bases(config: dict, keys: tuple[str, str], defaults: tuple[float, float]) -> tuple[float, float]:
    """The RoPE bases of the global and the sliding-window layers: `rope_parameters` per layer
    type (transformers 5), else the older top-level `keys`, else `defaults`."""
    params = config.get("rope_parameters") or {}

    def base(kind: str, key: str, default: float) -> float:
        own = params.get(kind) or {}
        if own.get("rope_type", "default") != "default":
            raise ModelError(f"RoPE scaling {own['rope_type']!r} of the {kind} layers is not supported")
        return float(own.get("rope_theta") or config.get(key) or default)

    return base("full_attention", keys[0], defaults[0]), base("sliding_attention", keys[1], defaults[1])
