"""Fused decoders for single queries: every decoder layer of a short batch (16 tokens or fewer)
in one persistent launch, ids to pooled vectors, behind one interface. Two peers: a CUDA kernel
compiled by NVRTC for the sizes it takes (rose.decoder.cuda: Qwen3-0.6B's, on Hopper), and a
Triton kernel for other sizes and GPUs (rose.decoder.triton). `--fused-decoder` picks
(auto|cuda|triton|off); `choose` is the pure rule (no torch here: a server's start asks it
while torch imports), rose.decoder.base.build tries its answer in order."""

from __future__ import annotations

from rose.errors import ModelError

CHOICES = ("auto", "cuda", "triton", "off")
"""The values of `--fused-decoder`."""


def choose(requested: str, on_gpu: bool, sixteen_bit: bool, capability: tuple[int, int]) -> list[str]:
    """The decoders to try, in order, for `requested` on a device (`on_gpu`, its compute
    `capability`) running the model in one 16-bit dtype (`sixteen_bit`: matmuls and activations)."""
    if requested not in CHOICES:
        raise ModelError(f"--fused-decoder must be one of {', '.join(CHOICES)}, not {requested!r}")
    if requested == "off" or not on_gpu or not sixteen_bit or capability < (8, 0):
        return []
    return ["cuda", "triton"] if requested == "auto" else [requested]
