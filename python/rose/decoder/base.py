"""The interface of the fused decoders, and building the one that serves a model here."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from rose.attention import AttentionSpec
from rose.batch import RaggedBatch
from rose.decoder import choose

log = logging.getLogger(__name__)


@dataclass
class DecoderWeights:
    """What a fused decoder reads of a model: its decoder layers (each with the attributes that
    rose.decoder.stacks.LAYER_TENSORS names), embedding, RoPE table and final norm."""

    layers: list
    embed: torch.Tensor
    rope: torch.Tensor  # [positions, head_dim] float32: cos, then sin
    final_norm: torch.Tensor
    spec: AttentionSpec
    eps: float


class Decoder(Protocol):
    """A fused decoder: made from a model's DecoderWeights on a device (raising ValueError, or
    the kernel's own error, where it cannot run), then called on batches of at most max_tokens."""

    name: str
    max_tokens: int

    def __call__(self, batch: RaggedBatch, pooling: str) -> torch.Tensor:
        """The batch's pooled float32 vectors [sequences, hidden] by `pooling` (rose.models.pooling)."""
        ...

    def describe(self) -> dict:
        """For /info: which kernel, which batches it takes, how it is cut."""
        ...


def build(requested: str, weights: DecoderWeights | None, device: torch.device) -> Decoder | None:
    """The first decoder of choose()'s answer that takes the model here; None for a model without
    one (`weights` None) or where none does. A CUDA decoder takes the layers' weights over only
    once its kernel is loaded, so a failure leaves them as they were for the next one."""
    if weights is None:
        return None
    dtype = weights.layers[0].qkv.weight.dtype
    on_gpu = device.type == "cuda"
    sixteen_bit = dtype in (torch.float16, torch.bfloat16) and weights.embed.dtype == dtype
    capability = torch.cuda.get_device_capability(device) if on_gpu else (0, 0)
    for name in choose(requested, on_gpu, sixteen_bit, capability):
        try:
            if name == "cuda":
                from rose.decoder.cuda import CudaDecoder

                return CudaDecoder(weights, device)
            from rose.decoder.triton import TritonDecoder

            return TritonDecoder(weights, device)
        except (ValueError, OSError, RuntimeError, ImportError) as why:
            log.info("the %s fused decoder does not serve this model here: %s", name, why)
    return None
