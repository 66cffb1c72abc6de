"""FlashInfer's ragged prefill kernels (FA2 and, on Hopper, FA3), run with no KV cache at all."""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from rose.attention.base import AttentionBackend, AttentionSpec, BackendUnavailable
from rose.batch import RaggedBatch
from rose.ops import kernels

# 128 MiB overflowed planning a large MiniLM batch with fa2 (144 MiB of scratch).
_WORKSPACE_BYTES = 512 << 20
# FlashInfer compiles head dims 64, 128 and 256 only; smaller heads are zero-padded up to 64
# (the padded lanes add nothing to q.k, and the softmax scale stays the real head dim's).
_SMALLEST_HEAD_DIM = 64
# FA2's smallest query tile, and more thread blocks than an SM ever holds: the bounds of its plan.
_SMALLEST_QUERY_TILE = 16
_MOST_BLOCKS_PER_SM = 32


def fa2_graph_plan_bytes(rows: int, sequences: int, group: int, num_kv_heads: int, sms: int) -> int:
    """An upper bound on the bytes an FA2 plan in CUDA-graph mode fills at the head of its int
    workspace: three arrays of one entry a launched block (tiles of at least 16 packed query rows,
    one partial tile per sequence, or the occupancy grid if that is larger), the output offsets,
    and the alignment of each (FlashInfer's PrefillPlan)."""
    tiles = -(-rows * group // _SMALLEST_QUERY_TILE) + sequences
    blocks = max(tiles, _MOST_BLOCKS_PER_SM * sms // num_kv_heads)
    return 4 * (3 * blocks + sequences + 1) + 8 * 16


@functools.cache
def shared_workspace(device: torch.device) -> torch.Tensor:
    """The device's one float workspace, which every wrapper shares (FlashInfer's advice: they
    never run at once), rather than 512 MiB more for each backend `auto` or a switch makes."""
    return torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


class FlashInferBackend(AttentionBackend):
    """BatchPrefillWithRaggedKVCacheWrapper; planned on the host once per batch."""

    variant = "fa2"
    min_capability = (8, 0)
    shares_keys = True

    def __init__(
        self,
        spec: AttentionSpec,
        device: torch.device,
        graph_sequences: int | None = None,
    ) -> None:
        super().__init__(spec, device)
        self.name = self.variant
        self.import_libraries()
        self.require_cuda(self.name, device, spec, self.min_capability)
        fi = kernels.flashinfer()
        self.head_dim = max(spec.head_dim, _SMALLEST_HEAD_DIM)
        self.workspace = shared_workspace(device)
        graph_buffers = {}
        if graph_sequences is not None:
            # A graph's wrapper reads its plan from fixed buffers; each replay re-plans into them.
            indptr = [torch.zeros(graph_sequences + 1, dtype=torch.int32, device=device) for _ in range(2)]
            graph_buffers = {"use_cuda_graph": True, "qo_indptr_buf": indptr[0], "kv_indptr_buf": indptr[1]}
        self.wrapper = fi.prefill.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend=self.variant, **graph_buffers
        )
        self._stale_plan: np.ndarray | None = None
        self._key_rows: torch.Tensor | None = None  # set by plan_keys: k and v are gathered first
        if graph_sequences is not None and self.variant == "fa2":
            # In graph mode FA2 launches a block for every tile the bucket could hold, and the
            # blocks past this batch's tiles read plan entries it did not write, unmasked when
            # split-KV is off: an earlier plan's (or a reused pinned buffer's) tile past a short
            # sequence's end reads keys out of bounds. Zeroed, they recompute tile 0 of sequence 0
            # (FlashInfer PR #5176 masks them instead).
            self._stale_plan = self.wrapper._pin_memory_int_workspace_buffer.numpy()
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            self._plan_bound = (graph_sequences, spec.num_heads // spec.num_kv_heads, spec.num_kv_heads, sms)

    @classmethod
    def import_libraries(cls) -> None:
        if kernels.flashinfer() is None:
            raise BackendUnavailable("flashinfer is not installed (pip install flashinfer-python)")

    def for_graph(self, key: tuple[int, int], batch: RaggedBatch) -> AttentionBackend:
        return type(self)(self.spec, self.device, graph_sequences=key[1])

    def plan(self, batch: RaggedBatch) -> None:
        self._plan(batch, batch.cu_seqlens_host)
        self._key_rows = None

    def plan_keys(self, batch: RaggedBatch, key_cu_seqlens: np.ndarray, key_rows: torch.Tensor) -> None:
        # FlashInfer aligns a causal mask to the end of the keys when a sequence has more keys
        # than queries, as a prefill after a cached prefix does.
        self._plan(batch, torch.from_numpy(key_cu_seqlens))
        self._key_rows = key_rows

    def _plan(self, batch: RaggedBatch, kv_indptr: torch.Tensor) -> None:
        if self._stale_plan is not None:
            self._stale_plan[: fa2_graph_plan_bytes(batch.num_tokens, *self._plan_bound)] = 0
        self.wrapper.plan(
            batch.cu_seqlens_host,
            kv_indptr,
            self.spec.num_heads,
            self.spec.num_kv_heads,
            self.head_dim,
            causal=self.spec.causal,
            sm_scale=self.spec.scale,
            q_data_type=self.spec.dtype,
            # Split-KV helps a few long queries over a long cache; here every query is its own
            # sequence's, and the split's scratch outgrew the workspace on steps of many sequences.
            disable_split_kv=True,
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Views into the fused QKV projection go in as they are: the kernels take each tensor's
        # token and head strides, so a copy of each would only cost a pass over it.
        if self._key_rows is not None:
            k, v = k.index_select(0, self._key_rows), v.index_select(0, self._key_rows)
        q, k, v = (t if _strided_ok(t) else t.contiguous() for t in (q, k, v))
        pad = self.head_dim - self.spec.head_dim
        if pad:
            q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        out = self.wrapper.run(q, k, v)
        return out[..., : self.spec.head_dim] if pad else out


def _strided_ok(t: torch.Tensor) -> bool:
    """Whether FlashInfer reads t [tokens, heads, dim] in place: unit stride within a head, and
    rows and heads on 16-byte boundaries (its vector loads)."""
    aligned = t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
    return t.stride(-1) == 1 and aligned


class FlashInfer3Backend(FlashInferBackend):
    """FlashInfer's FA3 kernels, for Hopper."""

    variant = "fa3"
    min_capability = (9, 0)
