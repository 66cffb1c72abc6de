"""The GPU's side of a step: the batch through page-locked staging into static device buffers,
the forward pass under a CUDA graph of its bucket (or eagerly), and the result's asynchronous
copy to the host, without the host waiting for the device."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rose.attention import AttentionBackend
from rose.batch import RaggedBatch
from rose.runtime.buckets import bucket
from rose.runtime.graphs import CudaGraphs
from rose.runtime.inputs import DeviceInputs
from rose.serving.lazy import LazyTensor
from rose.serving.timeline import StepTimeline

Forward = Callable[[RaggedBatch, AttentionBackend], torch.Tensor]
Head = Callable[[torch.Tensor], torch.Tensor]
"""A score model's head: pooled float32 states [sequences, hidden] to logits [sequences, labels]."""


class CudaSteps:
    """One engine's streams, input buffers, graphs and timeline. Call `step` with the stream that
    was current when this was made still current (it is held, not looked up: each lookup costs the
    host microseconds, several a step)."""

    def __init__(
        self,
        device: torch.device,
        max_tokens: int,
        max_sequences: int,
        graphs: str,
        max_graphs: int,
        attention: AttentionBackend,
    ) -> None:
        self._device = device
        self._stream = torch.cuda.current_stream(device)
        self._copy_stream = torch.cuda.Stream(device)
        self.inputs = DeviceInputs(device, *bucket(max_tokens, max_sequences), self._stream)
        self.timeline = StepTimeline()
        self._last_copy: torch.cuda.Event | None = None
        # A backend whose launches follow each batch's lengths cannot be captured.
        off = graphs == "off" or not attention.graph_safe
        self.graphs = None if off else CudaGraphs(graphs, max_graphs, attention, self._stream)

    def use_attention(self, attention: AttentionBackend) -> None:
        """A new backend comes with graphs of its own."""
        if self.graphs is not None:
            mode, most = self.graphs.mode, self.graphs.max_graphs
            self.graphs = CudaGraphs(mode, most, attention, self._stream) if attention.graph_safe else None

    def forget_graphs(self, min_tokens: int) -> None:
        """Drops the graphs of buckets of `min_tokens` or more (the model's kernels for such steps
        changed): their buckets run eagerly and capture again."""
        if self.graphs is not None:
            self.graphs.forget(min_tokens)

    def step(
        self,
        ids: np.ndarray,
        cu: np.ndarray,
        attention: AttentionBackend,
        forward: Forward,
        smallest_bucket: int | None,
        max_input_length: int,
        token_type_ids: np.ndarray | None = None,
        head: Head | None = None,
        per_token: bool = False,
    ) -> LazyTensor:
        """Enqueues the batch; returns its pooled vectors (through `head`, a score model's, if
        given), or with `per_token` `forward`'s row a token, as a LazyTensor with a forecast end.
        Batches with token type ids, and token steps, take graphs of their own."""
        tokens, sequences = len(ids), len(cu) - 1
        inputs = self.inputs
        # Graphs share one memory pool: the previous result leaves it before the next replay.
        if self._last_copy is not None:
            self._stream.wait_event(self._last_copy)
        # The step's GPU work starts once the host has it enqueued, so the timeline begins after
        # the host's wait: if the host is late, the GPU's wait shows as idle, not as busy.
        inputs.wait_free()
        self.timeline.begin(self._stream)
        padded, slots = bucket(tokens, sequences, smallest_bucket)
        key = (padded, slots) + (() if token_type_ids is None else ("typed",)) + (("tokens",) if per_token else ())
        limit = max(max_input_length, 256)  # the longest sequence a graph plans for
        fits = padded <= inputs.max_tokens and slots <= inputs.max_sequences
        # Only replays' ends are forecast: an eager run's span (JIT, kernel loads on a first hit)
        # says little about the next one's, and a forecast too late makes its waiter oversleep.
        replay: tuple | None = None
        # No sequence is longer than the batch, so the offsets' differences (host time on a
        # query's path before its launch) are taken only past the limit.
        # A backend other than the graphs' (one that cannot be captured) runs eagerly.
        graphed = self.graphs is not None and attention.graph_safe
        if graphed and fits and (tokens <= limit or _longest(cu) <= limit):
            replay = key if self.graphs.captured(key) else None
            batch = inputs.fill(ids, cu, padded, slots, min(padded, limit), token_type_ids)
            graph_attention = self.graphs.attention_for(key, batch)
            graph_attention.plan(batch)
            inputs.mark_uploaded()
            pooled = self.graphs.run(key, batch, forward)[: tokens if per_token else sequences]
        else:
            if tokens <= inputs.max_tokens and sequences <= inputs.max_sequences:
                batch = inputs.fill(ids, cu, tokens, sequences, _longest(cu), token_type_ids)
            else:  # larger than the static buffers: a one-off upload
                batch = RaggedBatch.from_host(ids, cu, self._device, token_type_ids)
            attention.plan(batch)
            inputs.mark_uploaded()
            pooled = forward(batch, attention)
        if head is not None:  # a few small kernels after the graph, not inside it
            pooled = head(pooled)
        # The copy first: the timeline's bookkeeping can wait, the result cannot.
        lazy = LazyTensor.from_device(pooled, self._copy_stream, self._stream)
        lazy.ready_at = self.timeline.end(self._stream, replay)
        self._last_copy = lazy.done
        return lazy

    def eager(self, compute: Callable[[], torch.Tensor]) -> LazyTensor:
        """A step whose batch the caller uploaded and planned itself, run eagerly by `compute`;
        its result copied back as `step`'s is."""
        if self._last_copy is not None:
            self._stream.wait_event(self._last_copy)
        self.timeline.begin(self._stream)
        lazy = LazyTensor.from_device(compute(), self._copy_stream, self._stream)
        lazy.ready_at = self.timeline.end(self._stream, None)
        self._last_copy = lazy.done
        return lazy

    def describe_graphs(self) -> dict:
        """For /info."""
        return self.graphs.describe() if self.graphs is not None else {"mode": "off"}


def _longest(cu_seqlens: np.ndarray) -> int:
    """The longest sequence's length (0 for none)."""
    return int(np.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0
