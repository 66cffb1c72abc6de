"""Whole-model CUDA graphs, captured lazily per bucket: a configuration's first hit runs eagerly
(warm-up, JIT), its second captures, later hits replay. All graphs share one memory pool; the
least recently used goes once more than `max_graphs` are kept."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rose.attention import AttentionBackend
from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.runtime.cuda_driver import driver_for

log = logging.getLogger(__name__)

GRAPH_MODES = ("off", "lazy", "eager")

Forward = Callable[[RaggedBatch, AttentionBackend], torch.Tensor]


@dataclass
class _Graph:
    attention: AttentionBackend
    hits: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    output: torch.Tensor | None = None
    graph_exec: int = 0  # the instantiated graph, launched through the driver (0: through torch)


@dataclass
class GraphStats:
    captured: int = 0
    replays: int = 0
    eager_runs: int = 0
    evicted: int = 0
    forgotten: int = 0
    pool_bytes: int = 0
    capture_seconds: float = 0.0


class CudaGraphs:
    """The graphs of one engine, keyed by (token bucket, sequence slots), replayed on `stream`
    (the engine's, current wherever run() is called)."""

    def __init__(self, mode: str, max_graphs: int, attention: AttentionBackend, stream: torch.cuda.Stream) -> None:
        if mode not in GRAPH_MODES:
            raise ModelError(f"cuda graphs must be one of {', '.join(GRAPH_MODES)}, not {mode!r}")
        if max_graphs < 1:  # each capture would evict itself, and its pool could not be captured into again
            raise ModelError(f"max cuda graphs must be at least 1, not {max_graphs} (cuda graphs off turns them off)")
        # Replays are launched through the driver, not CUDAGraph.replay(): about half the host's
        # time a launch, on a query's path before its kernel.
        self._driver = driver_for(stream.device_index)
        self._stream = stream.cuda_stream
        self.mode = mode
        self.max_graphs = max_graphs
        self.base_attention = attention
        self.pool = torch.cuda.graph_pool_handle()
        self._capture_stream = torch.cuda.Stream()
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.stats = GraphStats()

    def attention_for(self, key: tuple[int, int], batch: RaggedBatch) -> AttentionBackend:
        """The attention backend instance that the graph of `key` uses (plan it before `run`)."""
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = _Graph(self.base_attention.for_graph(key, batch))
        self.graphs.move_to_end(key)
        return entry.attention

    def captured(self, key: tuple[int, int]) -> bool:
        """Whether `run` replays the graph of `key` (rather than running eagerly or capturing)."""
        entry = self.graphs.get(key)
        return entry is not None and entry.graph is not None

    def run(self, key: tuple[int, int], batch: RaggedBatch, forward: Forward) -> torch.Tensor:
        """Runs the model on `batch` (already in the static buffers) through the graph of `key`."""
        entry = self.graphs[key]
        if entry.graph is not None:
            self._replay(entry)
            self.stats.replays += 1
            return entry.output
        entry.hits += 1
        if entry.hits == 1:
            self.stats.eager_runs += 1
            output = forward(batch, entry.attention)
            if self.mode == "lazy":
                return output
        self._capture(key, entry, batch, forward)
        self._replay(entry)
        return entry.output

    def _replay(self, entry: _Graph) -> None:
        if entry.graph_exec:
            self._driver.launch_graph(entry.graph_exec, self._stream)
        else:
            entry.graph.replay()

    def _capture(self, key: tuple[int, int], entry: _Graph, batch: RaggedBatch, forward: Forward) -> None:
        start = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        # Not torch.cuda.graph(): it first synchronizes and empties the device's and the pinned
        # host memory's caches (tens of ms, on the request that captures), which frees the
        # LazyTensors' pinned buffers too; a graph in its own pool needs neither.
        current = torch.cuda.current_stream()
        self._capture_stream.wait_stream(current)
        reserved = torch.cuda.memory_reserved()
        with torch.cuda.stream(self._capture_stream):
            # thread_local: Tulip's waiter thread may wait on events while this thread captures.
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                entry.output = forward(batch, entry.attention)
            finally:
                graph.capture_end()
        current.wait_stream(self._capture_stream)
        entry.graph = graph
        raw_exec = getattr(graph, "raw_cuda_graph_exec", None)  # torch >= 2.8
        entry.graph_exec = raw_exec() if raw_exec is not None else 0
        self.stats.pool_bytes += max(torch.cuda.memory_reserved() - reserved, 0)
        self.stats.captured += 1
        self.stats.capture_seconds += time.perf_counter() - start
        log.debug("captured the CUDA graph of %s tokens x %s sequences", *key)
        while sum(e.graph is not None for e in self.graphs.values()) > self.max_graphs:
            oldest = next(k for k, e in self.graphs.items() if e.graph is not None)
            self.graphs.pop(oldest).graph.reset()
            self.stats.evicted += 1

    def forget(self, min_tokens: int) -> None:
        """Drops the graphs of buckets of `min_tokens` or more: their next hits run eagerly and
        capture again."""
        forgotten = 0
        for key in [k for k in self.graphs if k[0] >= min_tokens]:
            graph = self.graphs.pop(key).graph
            if graph is not None:
                graph.reset()
                forgotten += 1
        self.stats.forgotten += forgotten
        if forgotten and not any(e.graph is not None for e in self.graphs.values()):
            # torch refuses to capture into a pool all of whose graphs were reset (an internal
            # assert in its allocator), so the next capture takes a new one; the old pool's
            # memory goes back once nothing holds it.
            self.pool = torch.cuda.graph_pool_handle()
            torch.cuda.empty_cache()

    def describe(self) -> dict:
        captured = [k for k, e in self.graphs.items() if e.graph is not None]
        return {
            "mode": self.mode,
            "graphs": len(captured),
            "max_graphs": self.max_graphs,
            "pool_bytes": self.stats.pool_bytes,
            "captures": self.stats.captured,
            "replays": self.stats.replays,
            "eager_runs": self.stats.eager_runs,
            "evicted": self.stats.evicted,
            "forgotten": self.stats.forgotten,
            "capture_seconds": round(self.stats.capture_seconds, 3),
        }
