"""Getting a batch's token ids and offsets onto the GPU without making the host wait.

A copy from pageable memory makes the host wait for the stream to drain, which would stop the
host from enqueuing batch N+1 while batch N runs. So ids and offsets go through one page-locked
staging buffer into static device buffers (static so that CUDA graphs can read them), in one copy
that the CUDA driver enqueues (torch's copy_ costs the host more, on a query's path before its
graph's launch).
"""

from __future__ import annotations

import numpy as np
import torch

from rose.batch import RaggedBatch
from rose.runtime.cuda_driver import driver_for


class DeviceInputs:
    """Static device buffers for up to `max_tokens` ids and `max_sequences` offsets, filled from a
    page-locked staging buffer of the same layout in one copy on `stream`."""

    def __init__(self, device: torch.device, max_tokens: int, max_sequences: int, stream: torch.cuda.Stream) -> None:
        # Offsets first, then the real token count, then the ids from an aligned start:
        # [cu_seqlens ... | count | ids ...].
        self._ids_at = -(-(max_sequences + 2) // 64) * 64
        self._max_sequences = max_sequences
        size = self._ids_at + max_tokens
        self._device = torch.zeros(size, dtype=torch.int32, device=device)
        self.staging = torch.zeros(size, dtype=torch.int32, pin_memory=True)
        self._host = self.staging.numpy()
        # Token type ids (pairs for cross-encoders), uploaded apart and only for batches that have them.
        self._types = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self._types_staging = torch.zeros(max_tokens, dtype=torch.int32, pin_memory=True)
        self._stream, self._stream_handle = stream, stream.cuda_stream
        self._driver = driver_for(device.index if device.index is not None else torch.cuda.current_device())
        # The views a batch of (tokens, sequences) reads, made once: slicing tensors costs the host
        # microseconds a view, on a query's path, and a graph's bucket repeats.
        self._views: dict[tuple[int, int], tuple] = {}
        # One event, recorded again for each batch once the previous one's uploads are done.
        self._uploaded = torch.cuda.Event()
        self._pending = False

    @property
    def max_tokens(self) -> int:
        return self._device.numel() - self._ids_at

    @property
    def max_sequences(self) -> int:
        return self._max_sequences

    def fill(
        self,
        ids: np.ndarray,
        cu_seqlens: np.ndarray,
        tokens: int,
        sequences: int,
        max_seqlen: int,
        token_type_ids: np.ndarray | None = None,
    ) -> RaggedBatch:
        """Uploads a batch padded to `tokens` tokens and `sequences` sequences: the padding tokens
        (id 0, type 0) form one extra sequence, and the remaining sequences are empty."""
        real_tokens, real_sequences = len(ids), len(cu_seqlens) - 1
        if real_tokens > tokens or real_sequences + (tokens > real_tokens) > sequences:
            raise ValueError(f"{real_tokens} tokens in {real_sequences} sequences do not fit {tokens} in {sequences}")
        if tokens > self.max_tokens or sequences > self.max_sequences:
            raise ValueError(f"{tokens} tokens in {sequences} sequences exceed the engine's buffers")
        self.wait_free()
        host, at = self._host, self._ids_at
        cu = host[: sequences + 1]
        cu[: real_sequences + 1] = cu_seqlens
        cu[real_sequences + 1 :] = tokens
        host[at - 1] = real_tokens
        host[at : at + real_tokens] = ids
        host[at + real_tokens : at + tokens] = 0
        views = self._views.get((tokens, sequences))
        if views is None:
            if len(self._views) >= 256:  # eager batches of every size would otherwise pile up
                self._views.clear()
            views = self._views[(tokens, sequences)] = self._slice(tokens, sequences)
        upload, on_device, cu, cu_host, count = views
        self._driver.copy_to_device(*upload, self._stream_handle)
        unpadded = (real_tokens, real_sequences)
        batch = RaggedBatch(on_device, cu, cu_host, max_seqlen, token_count=count, unpadded=unpadded)
        if token_type_ids is not None:
            types = self._types_staging.numpy()
            types[:real_tokens] = token_type_ids
            types[real_tokens:tokens] = 0
            size = tokens * self._types.element_size()
            self._driver.copy_to_device(
                self._types.data_ptr(), self._types_staging.data_ptr(), size, self._stream_handle
            )
            batch.token_type_ids = self._types[:tokens]
        return batch

    def _slice(self, tokens: int, sequences: int) -> tuple:
        """The upload (destination, source, bytes), the ids, the offsets (device and host) and the count."""
        at, device = self._ids_at, self._device
        return (
            (device.data_ptr(), self.staging.data_ptr(), (at + tokens) * device.element_size()),
            device[at : at + tokens],
            device[: sequences + 1],
            self.staging[: sequences + 1],
            device[at - 1 : at],
        )

    def wait_free(self) -> None:
        """Waits until the previous batch's uploads (and any plan copies enqueued with them) have
        left the staging buffer, so that it can be rewritten."""
        if self._pending:
            self._uploaded.synchronize()
            self._pending = False

    def mark_uploaded(self) -> None:
        """Call once every host-to-device copy of the batch (the attention plan's too) is enqueued
        on the stream."""
        self._uploaded.record(self._stream)
        self._pending = True
