"""The interface every attention backend implements over a packed ragged batch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch

from rose.batch import RaggedBatch


@dataclass(frozen=True)
class AttentionSpec:
    """The attention a model needs, independent of how it is computed."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    dtype: torch.dtype = torch.float32
    window: int | None = None
    """A sliding window's half width for the layers that ask for one (`windowed=True`): a query
    sees the keys at most `window` positions away on either side (ModernBERT's local layers)."""
    softmax_scale: float | None = None
    """The scores' scale where the model sets its own (Gemma3's query_pre_attn_scalar ** -0.5)."""
    relative_bias: torch.Tensor | None = field(default=None, compare=False, repr=False)
    """[heads, 2 * longest - 1]: a bias added to the scores by key-minus-query distance
    (index d + longest - 1), as MPNet's; only backends with `takes_relative_bias` add it."""

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else self.head_dim**-0.5


class BackendUnavailable(RuntimeError):
    """A backend cannot run here (missing library, device, or unsupported shape); says why."""


class AttentionBackend(ABC):
    """Attention over ragged sequences, with no padding and no KV cache."""

    name: str
    takes_relative_bias = False
    """Whether the backend adds `AttentionSpec.relative_bias` (the others refuse such a spec)."""
    takes_window = False
    """Whether the backend takes `windowed=True` for `AttentionSpec.window` (the others refuse
    such a spec)."""
    graph_safe = True
    """Whether a CUDA graph may capture the backend's kernels (its plan changes no launch shape)."""
    shares_keys = False
    """Whether `plan_keys` takes a batch whose keys are gathered rows (a shared prefix's)."""

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        if spec.relative_bias is not None and not self.takes_relative_bias:
            raise BackendUnavailable(f"{type(self).__name__} does not add a relative position bias")
        if spec.window is not None and not self.takes_window:
            raise BackendUnavailable(f"{type(self).__name__} takes no symmetric sliding window")
        self.spec = spec
        self.device = device

    @classmethod
    def import_libraries(cls) -> None:
        """Imports the libraries this backend needs (seconds, for some), so that a later
        construction is quick; raises BackendUnavailable when they do not import. Most need
        nothing beyond torch."""
        return None

    @staticmethod
    def require_cuda(name: str, device: torch.device, spec: AttentionSpec, min_capability: tuple[int, int]) -> None:
        """Raises BackendUnavailable unless `device` is a GPU of `min_capability` and the model
        runs in 16-bit floats."""
        if device.type != "cuda":
            raise BackendUnavailable(f"{name} runs on a CUDA GPU, not on {device}")
        capability = torch.cuda.get_device_capability(device)
        if capability < min_capability:
            raise BackendUnavailable(f"{name} needs compute capability {min_capability}, this GPU has {capability}")
        if spec.dtype not in (torch.float16, torch.bfloat16):
            raise BackendUnavailable(f"{name} needs float16 or bfloat16, not {spec.dtype}")

    @abstractmethod
    def plan(self, batch: RaggedBatch) -> None:
        """Host-side preparation for one batch, shared by every layer."""

    def plan_keys(self, batch: RaggedBatch, key_cu_seqlens: np.ndarray, key_rows: torch.Tensor) -> None:
        """`plan` for a causal batch whose sequence i attends to rows
        `key_rows[key_cu_seqlens[i]:key_cu_seqlens[i + 1]]` of k and v, its own queries being the
        last of those keys (rose.runtime.shared_prefix); eager only. `plan` undoes it."""
        raise BackendUnavailable(f"{type(self).__name__} does not attend to gathered keys")

    def for_graph(self, key: tuple[int, int], batch: RaggedBatch) -> AttentionBackend:
        """The instance a CUDA graph of `key` (token bucket, sequence slots) captures and replays.
        Backends that read everything from device tensors at run time serve every graph."""
        return self

    @abstractmethod
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windowed: bool = False) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim] -> [tokens, heads, dim];
        `windowed`: within the spec's sliding window (backends with `takes_window`)."""

    def norm_rope_attention(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                            rope: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """Qwen3's attention straight from the fused projection qkv [tokens, (heads + 2 kv_heads) *
        dim]: per-head RMSNorm of q and k, RoPE, attention, in one launch -> [tokens, heads * dim].
        None where this backend cannot for this batch; the model then takes those steps apart."""
        return None


class OffsetsOnDeviceBackend(AttentionBackend):
    """A backend whose kernel reads the batch's offsets from the device when it runs: planning
    only remembers the batch, and one instance serves every CUDA graph."""

    batch: RaggedBatch | None = None

    def plan(self, batch: RaggedBatch) -> None:
        self.batch = batch
