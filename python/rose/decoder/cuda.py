"""The CUDA fused decoder: a Qwen3-style decoder's single queries (at most 16 tokens), ids to
pooled vectors, in one launch of decoder_kernel.cu (the file says how it works), for the sizes it
takes (Qwen3-0.6B's, on Hopper); faster there than rose.decoder.triton, which serves the others
(benches/RESULTS.md has the figures).

The kernel is compiled by NVRTC for the model's sizes (rose.decoder.cuda_build: a server's start
does it while torch imports); rose.runtime.nvrtc keeps the cubin on disk, so a later start only
reads it. It is launched through the driver on torch's current stream, so CUDA graphs capture it
like any kernel.

The grid barrier needs every block resident at once (one per SM). Other kernels only delay it, but
two launches of it running together on one GPU (two streams, or two processes under MPS) could
each hold part of the SMs and wait for each other; an engine runs its steps on one stream."""

from __future__ import annotations

import ctypes

import torch

from rose.batch import RaggedBatch
from rose.decoder.base import DecoderWeights
from rose.decoder.cuda_build import MAX_TOKENS, SQUARES, STAGES, THREADS, compile_kernel, fits, shared_bytes
from rose.decoder.stacks import LAYER_TENSORS, stack_layers
from rose.runtime.cuda_driver import driver_for

POOLING = {"mean": 0, "cls": 1, "last": 2}
"""The kernel's codes of the poolings (rose.models.pooling's modes)."""


class CudaDecoder:
    """decoder_kernel.cu as a rose.decoder.Decoder: the embedding, layers, final norm and pooling
    in one launch. Takes the layers' weights over (rose.decoder.stacks)."""

    name = "cuda"
    max_tokens = MAX_TOKENS

    def __init__(self, weights: DecoderWeights, device: torch.device) -> None:
        """Raises ValueError for sizes or GPUs the kernel does not take, NvrtcError without NVRTC
        or when it fails, CudaError when the driver refuses it."""
        first, spec = weights.layers[0], weights.spec
        hidden, inter = first.input_norm.shape[0], first.down.weight.shape[1]
        head_dim, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
        properties = torch.cuda.get_device_properties(device)
        if (properties.major, properties.minor) < (9, 0):
            raise ValueError("the CUDA decoder needs Hopper's bulk copies (sm_90 or later)")
        if not fits(hidden, inter, heads, kv_heads, head_dim, properties.multi_processor_count):
            raise ValueError("the model's sizes do not fit the CUDA decoder's blocks")
        self._weights = weights
        self.eps, self.scale, self.hidden = weights.eps, spec.scale, hidden
        self.programs = hidden // 8
        self.shared = shared_bytes(hidden, inter, heads, kv_heads, head_dim)
        dtype = first.qkv.weight.dtype
        cubin = compile_kernel(hidden, inter, heads, kv_heads, head_dim, len(weights.layers), spec.causal,
                               dtype == torch.float16, properties.major * 10 + properties.minor)  # fmt: skip
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._driver = driver_for(index)
        self._function = self._driver.load_function(cubin, "decoder_layers", self.shared)
        self.stacks = stack_layers(weights.layers)
        # [0]: blocks arrived, [1]: blocks gone; from SQUARES: the rows' sums of squares (float32,
        # by layer parity). The kernel leaves them all at zero.
        self.barrier = torch.zeros(SQUARES + 2 * MAX_TOKENS, dtype=torch.int32, device=device)
        # The kernel's scratch: x (the residual stream, float32), q k v, the MLP's activation, and
        # x * g for the next QKV (16-bit). One launch runs at a time (see above).
        n_qkv = (heads + 2 * kv_heads) * head_dim
        self._scratch = [
            torch.empty(MAX_TOKENS, width, dtype=kind, device=device)
            for width, kind in ((hidden, torch.float32), (n_qkv, dtype), (inter, dtype), (hidden, dtype))
        ]

    def describe(self) -> dict:
        return {"kernel": self.name, "max_tokens": MAX_TOKENS, "programs": self.programs, "stages": STAGES}

    def __call__(self, batch: RaggedBatch, pooling: str) -> torch.Tensor:
        """The batch's pooled vectors [sequences, hidden] in float32 (empty sequences: zeros)."""
        w = self._weights
        tokens, sequences, device = batch.num_tokens, batch.num_sequences, w.embed.device
        assert tokens <= MAX_TOKENS and w.rope.dtype == torch.float32
        assert batch.input_ids.dtype == torch.int32 and batch.cu_seqlens.dtype == torch.int32
        assert w.embed.dtype == w.final_norm.dtype == self.stacks["qkv"].dtype
        out = torch.empty(sequences, self.hidden, dtype=torch.float32, device=device)
        tensors = [batch.input_ids, batch.cu_seqlens, batch.device_token_count(), w.embed, w.rope, *self._scratch,
                   self.barrier, *(self.stacks[name] for name in LAYER_TENSORS), w.final_norm, out]  # fmt: skip
        args = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        args += [ctypes.c_int(sequences), ctypes.c_int(POOLING[pooling]), ctypes.c_float(self.eps)]
        args.append(ctypes.c_float(self.scale))
        stream = torch.cuda.current_stream(device).cuda_stream
        self._driver.launch(self._function, self.programs, THREADS, self.shared, stream, args)
        return out
