"""Qwen3 for single queries (at most 16 tokens), ids to pooled vectors, in one launch of a CUDA
kernel, decoder_kernel.cu (the file says how it works), for the sizes it takes: Qwen3-0.6B's, on Hopper.
rose.fused_decoder's Triton kernel serves the other sizes and GPUs; this one took 0.54-0.55 ms a
16-token query on the H200 where the Triton one took 0.78 (benches/RESULTS.md).

The kernel is compiled by NVRTC for the model's sizes when the model loads; rose.nvrtc keeps the
cubin on disk, so a later start only reads it. It is launched through the driver on torch's
current stream, so CUDA graphs capture it like any kernel.

The grid barrier needs every block resident at once (one per SM). Other kernels only delay it, but
two launches of it running together on one GPU (two streams, or two processes under MPS) could
each hold part of the SMs and wait for each other; an engine runs its steps on one stream."""

from __future__ import annotations

import ctypes

import torch

from rose import nvrtc
from rose.attention import AttentionSpec
from rose.batch import RaggedBatch
from rose.cuda_driver import CudaDriver
from rose.stacked_layers import LAYER_TENSORS, stack_layers

MAX_TOKENS = 16
"""The largest (padded) batch the kernel takes: the M of one tensor-core product."""

STAGES = 8
"""Weight chunks of 16 KB in flight a block (6 and 10 were no faster on the H200)."""

_THREADS = 288  # 8 consumer warps and the producer
_SLOT = 16384  # bytes of a weight chunk in shared memory
_MAX_SHARED = 227 * 1024  # an H100's or H200's shared memory a block
_STATIC_SHARED = 256  # the kernel's `started` and token_seq, token_pos, as ptxas places them
_SQUARES = 1024  # the rows' sums of squares in the barrier tensor: 4 KB from the counter every block polls


def fits(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, sms: int) -> bool:
    """Whether the kernel takes a model of these sizes on a GPU of `sms` SMs: a block a group of 8
    of x's columns (so HID / 8 blocks, all resident), a chunk of 8 weight rows over the hidden
    dimension (16 KB), heads of 128 dims split evenly over the blocks."""
    grid = hidden // 8
    return (
        hidden * 8 * 2 == _SLOT
        and grid <= sms
        and head_dim == 128
        and heads % kv_heads == 0
        and grid % heads == 0
        and ((heads + 2 * kv_heads) * head_dim) % (grid * 8) == 0
        and (hidden // (grid // heads)) % (_SLOT // 2 // head_dim) == 0
        and inter % (grid * 8) == 0
        and inter % hidden == 0
        and shared_bytes(hidden, inter, heads, kv_heads, head_dim) + _STATIC_SHARED <= _MAX_SHARED
    )


def shared_bytes(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """The kernel's shared memory, as laid out there: the ring and its mbarriers, the warps'
    partial products and squares, the attention's q, k, v and output."""
    grid, rows = hidden // 8, MAX_TOKENS
    chunks = max((heads + 2 * kv_heads) * head_dim // grid // 8, 2 * (inter // grid) // 8)
    ring = STAGES * (_SLOT + 16)
    partials = chunks * 8 * 128 * 4 + 8 * 16 * 4
    attention = 3 * rows * head_dim * 2 + rows * (head_dim * 2 + 16)
    return ring + partials + attention


def kernel_options(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, layers: int, causal: bool, fp16: bool
) -> list[str]:
    """NVRTC's -D options for decoder_kernel.cu at these sizes (the macros its header lists)."""
    sizes = dict(HID=hidden, INTER=inter, HQ=heads, HK=kv_heads, D=head_dim, NLAYERS=layers, CAUSAL=int(causal),
                 GRID=hidden // 8, STAGES=STAGES, FP16=int(fp16), SQUARES=_SQUARES)  # fmt: skip
    return [f"-D{name}={value}" for name, value in sizes.items()]


POOLING = {"mean": 0, "cls": 1, "last": 2}
"""The kernel's codes of the poolings (rose.pooling's modes)."""


class CudaDecoder:
    """Qwen3 (rose.models.qwen3) as one launch of decoder_kernel.cu: its embedding, layers, final
    norm, and the pooling. Takes the layers' weights over (rose.stacked_layers)."""

    max_tokens = MAX_TOKENS
    pools = True
    """It returns pooled vectors (rose.models.qwen3.Qwen3.pooled), not token states."""

    def __init__(self, layers: list, spec: AttentionSpec, eps: float, device: torch.device) -> None:
        """Raises ValueError for sizes or GPUs the kernel does not take, nvrtc.NvrtcError without
        NVRTC or when it fails."""
        first = layers[0]
        hidden, inter = first.input_norm.shape[0], first.down.weight.shape[1]
        head_dim, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
        properties = torch.cuda.get_device_properties(device)
        if (properties.major, properties.minor) < (9, 0):
            raise ValueError("the CUDA decoder needs Hopper's bulk copies (sm_90 or later)")
        if not fits(hidden, inter, heads, kv_heads, head_dim, properties.multi_processor_count):
            raise ValueError("the model's sizes do not fit the CUDA decoder's blocks")
        self.inter, self.eps, self.scale = inter, eps, spec.scale
        self.n_qkv = (heads + 2 * kv_heads) * head_dim
        self.programs = hidden // 8
        self.shared = shared_bytes(hidden, inter, heads, kv_heads, head_dim)
        dtype = first.qkv.weight.dtype
        options = kernel_options(hidden, inter, heads, kv_heads, head_dim, len(layers), spec.causal,
                                 dtype == torch.float16)  # fmt: skip
        cubin = nvrtc.compile_cubin(nvrtc.source("decoder_kernel.cu"), "decoder_kernel",
                                    properties.major * 10 + properties.minor, options)  # fmt: skip
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._driver = CudaDriver(index)
        self._function = self._driver.load_function(cubin, "decoder_layers", self.shared)
        self.stacks = stack_layers(layers)
        # [0]: blocks arrived, [1]: blocks gone; from _SQUARES: the rows' sums of squares (float32,
        # by layer parity). The kernel leaves them all at zero.
        self.barrier = torch.zeros(_SQUARES + 2 * MAX_TOKENS, dtype=torch.int32, device=device)
        # The kernel's scratch: x (the residual stream, float32), q k v, the MLP's activation, and
        # x * g for the next QKV (16-bit). One launch runs at a time (see above).
        self._scratch = [
            torch.empty(MAX_TOKENS, width, dtype=kind, device=device)
            for width, kind in ((hidden, torch.float32), (self.n_qkv, dtype), (inter, dtype), (hidden, dtype))
        ]
        self.hidden = hidden

    def describe(self) -> dict:
        """For /info: which batches take the kernel, and how it is cut."""
        return {"kernel": "cuda", "max_tokens": MAX_TOKENS, "programs": self.programs, "stages": STAGES}

    def __call__(
        self, batch: RaggedBatch, embed: torch.Tensor, rope: torch.Tensor, final_norm: torch.Tensor, pooling: str
    ) -> torch.Tensor:
        """The batch's pooled vectors [sequences, hidden] in float32 (empty sequences: zeros), by
        `pooling` (see POOLING); `embed`, `final_norm`: the model's embedding and final norm."""
        tokens, sequences, device = batch.num_tokens, batch.num_sequences, embed.device
        assert tokens <= MAX_TOKENS and rope.dtype == torch.float32
        assert batch.input_ids.dtype == torch.int32 and batch.cu_seqlens.dtype == torch.int32
        assert embed.dtype == final_norm.dtype == self.stacks["qkv"].dtype
        count = batch.token_count
        if count is None:
            count = torch.full((1,), tokens, dtype=torch.int32, device=device)
        out = torch.empty(sequences, self.hidden, dtype=torch.float32, device=device)
        tensors = [batch.input_ids, batch.cu_seqlens, count, embed, rope, *self._scratch, self.barrier,
                   *(self.stacks[name] for name in LAYER_TENSORS), final_norm, out]  # fmt: skip
        args = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        args += [ctypes.c_int(sequences), ctypes.c_int(POOLING[pooling]), ctypes.c_float(self.eps)]
        args.append(ctypes.c_float(self.scale))
        stream = torch.cuda.current_stream(device).cuda_stream
        self._driver.launch(self._function, self.programs, _THREADS, self.shared, stream, args)
        return out
