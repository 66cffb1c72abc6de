"""Qwen3's decoder layers for single queries (at most 16 tokens) in one launch of a CUDA kernel,
decoder_kernel.cu (the file says how it works), for the sizes it takes: Qwen3-0.6B's, on Hopper.
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
from rose.stacked_layers import kernel_tensors, stack_layers

MAX_TOKENS = 16
"""The largest (padded) batch the kernel takes: the M of one tensor-core product."""

STAGES = 8
"""Weight chunks of 16 KB in flight a block (6 and 10 were no faster on the H200)."""

_THREADS = 288  # 8 consumer warps and the producer
_SLOT = 16384  # bytes of a weight chunk in shared memory
_MAX_SHARED = 227 * 1024  # an H100's or H200's shared memory a block
_STATIC_SHARED = 128  # the kernel's `started`, as ptxas places it
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


class CudaDecoder:
    """Qwen3's layers (rose.models.qwen3) as one launch of decoder_kernel.cu. Takes the layers'
    weights over (rose.stacked_layers)."""

    max_tokens = MAX_TOKENS

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
        self.xg = torch.empty(MAX_TOKENS, hidden, dtype=dtype, device=device)  # x * g for the next QKV

    def describe(self) -> dict:
        """For /info: which batches take the kernel, and how it is cut."""
        return {"kernel": "cuda", "max_tokens": MAX_TOKENS, "programs": self.programs, "stages": STAGES}

    def __call__(self, x: torch.Tensor, batch: RaggedBatch, rope: torch.Tensor) -> None:
        """Runs every layer on the embeddings x [tokens, hidden] float32, in place."""
        assert x.shape[0] <= MAX_TOKENS and x.dtype == torch.float32 and x.is_contiguous()
        assert batch.positions.dtype == torch.int32 and batch.seq_ids.dtype == torch.int64
        assert rope.dtype == torch.float32
        tensors = kernel_tensors(x, batch, rope, self.barrier, self.stacks, self.n_qkv, self.inter) + [self.xg]
        args = [ctypes.c_void_p(t.data_ptr()) for t in tensors] + [ctypes.c_float(self.eps), ctypes.c_float(self.scale)]
        stream = torch.cuda.current_stream(x.device).cuda_stream
        self._driver.launch(self._function, self.programs, _THREADS, self.shared, stream, args)
