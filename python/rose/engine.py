"""The ROSE engine: a model, an attention backend and pooling behind one step() call."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose import fidelity, prestart
from rose.attention import AttentionBackend, AutoBackend, create_backend
from rose.batch import RaggedBatch, as_int32
from rose.graphs import CudaGraphs, bucket
from rose.inputs import DeviceInputs
from rose.lazy import LazyTensor
from rose.model_dir import POOLING_MODES, ModelDir
from rose.models import model_class
from rose.pooling import pool, shape_vectors
from rose.timeline import StepTimeline
from rose.weights import load_weights

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# `mixed`: bfloat16 matmuls (float32 accumulation), float32 activations, norms and attention.
MIXED = "mixed"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """ "auto" is the GPU when there is one, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """The activations' and the matmuls' dtypes. "auto" is bfloat16 on the GPU and float32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype, dtype
    if dtype == MIXED:
        return torch.float32, torch.bfloat16
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, {MIXED}, {', '.join(_DTYPES)}")
    return _DTYPES[dtype], _DTYPES[dtype]


class Engine:
    """Loads a model folder and embeds packed batches of token ids."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        attention_backend: str = "auto",
        pooling: str | None = None,
        max_batch_tokens: int | None = None,
        max_batch_requests: int | None = None,
        cuda_graphs: str = "lazy",
        max_cuda_graphs: int = 256,
        warmup: Sequence[str] = (),
        verify: bool = True,
        defer_attention: bool = False,
    ) -> None:
        self.model_dir = ModelDir.open(model)
        self.device = resolve_device(device)
        self.dtype, self.matmul_dtype = resolve_dtype(dtype, self.device)
        self.pooling = pooling or self.model_dir.pooling
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {self.pooling!r}; use {', '.join(POOLING_MODES)}")
        on_gpu = self.device.type == "cuda"
        self.max_batch_tokens = max_batch_tokens or (16384 if on_gpu else 4096)
        self.max_batch_requests = max_batch_requests or 512
        marks = [time.perf_counter()]
        # Triton hashes its installation before its first kernel: on a thread while the weights
        # load (unless rose.prestart did it while torch imported), waited for before that kernel,
        # which would otherwise hash it again beside the thread.
        triton_key = _in_background(prestart.warm_triton) if on_gpu else None
        self._cls = model_class(self.model_dir.model_type)
        # Straight onto the device: the model and the fidelity check's float32 reference are both
        # built from these there, without a second trip over PCIe.
        weights = load_weights(self.model_dir.path, self._cls.weight_prefixes, self.device)
        marks.append(time.perf_counter())
        self.model = self._cls(self.model_dir.config, weights, self.dtype, self.device, self.matmul_dtype)
        # The model's one-launch path for single queries (rose.fused_decoder), if it has one.
        self.fused_decoder = getattr(self.model, "fused", None)
        marks.append(time.perf_counter())
        self.use_attention(attention_backend, defer=defer_attention)
        self._tokenizer: Any = None
        self.graphs: CudaGraphs | None = None
        self.fidelity: dict[str, Any] | None = None
        self._deferred: Future[None] | None = None
        if on_gpu:
            # Held, not looked up: torch's current-stream lookups cost the host a few us each, several a step.
            self._stream = torch.cuda.current_stream(self.device)
            self._copy_stream = torch.cuda.Stream(self.device)
            max_tokens, max_sequences = bucket(self.max_batch_tokens, self.max_batch_requests)
            self._inputs = DeviceInputs(self.device, max_tokens, max_sequences, self._stream)
            self._timeline = StepTimeline()
            self._last_copy: torch.cuda.Event | None = None
            if cuda_graphs != "off":
                self.graphs = CudaGraphs(cuda_graphs, max_cuda_graphs, self.attention, self._stream)
        marks.append(time.perf_counter())
        self._expected: tuple[list[list[int]], np.ndarray] | None = None
        # With defer_attention, and a small-batch kernel or backends left for later, start-up
        # checks and serves the short batches (online queries) only; the first longer batch waits
        # for the rest (see _prepare_long_batches). The long path's first run imports
        # torch._dynamo (1.2 s on the H200) with torch's varlen kernel, FlashInfer or FA4 alike.
        auto = self.attention if isinstance(self.attention, AutoBackend) else None
        self._long_pending = defer_attention and auto is not None and bool(auto.small or auto.deferred)
        # Likewise, with a path of its own for single queries (the fused decoder), start-up checks
        # that path only; the first batch longer than it takes waits for the short batches' check
        # (see _check_short_batches), whose first runs (cuBLAS's and Triton's) took 0.2-0.5 s.
        checks = verify and (on_gpu or self.matmul_dtype != self.dtype)
        self._short_pending = defer_attention and checks and self.smallest_bucket is not None
        if triton_key is not None:
            wait([triton_key])
        for spec in warmup:
            self._warm(spec)
        marks.append(time.perf_counter())
        if checks:  # the tiers left for later (above) are checked before the first batch they serve
            left = 2 if self._short_pending else 1 if self._long_pending else 0
            self.fidelity = self.check_fidelity(weights=weights, tiers=fidelity.TIERS[: len(fidelity.TIERS) - left])
        del weights
        marks.append(time.perf_counter())
        # Where start-up time goes, for /info: the first-answer target depends on it.
        # "read_weights" includes creating the CUDA context (unless rose.prestart made it while
        # torch imported); "attention", importing its libraries; "warmup", waiting for Triton's key.
        phases = ("read_weights", "build_model", "attention", "warmup", "fidelity_check")
        self.startup_seconds = {k: round(b - a, 3) for k, a, b in zip(phases, marks[:-1], marks[1:], strict=True)}
        log.info(
            "ROSE serves %s (%s) on %s in %s with %s attention, %s pooling and CUDA graphs %s; start-up %s",
            self.model_dir.model_id,
            self.model_dir.model_type,
            self.device,
            self.dtype_name,
            self.attention.name,
            self.pooling,
            self.graphs.mode if self.graphs else "off",
            ", ".join(f"{k} {v:.2f} s" for k, v in self.startup_seconds.items()),
        )
        if self._long_pending and auto is not None and auto.deferred:
            self._deferred = _in_background(auto.import_deferred)
            log.info("importing the attention backends %s in the background", ", ".join(auto.deferred))

    def use_attention(self, name: str, defer: bool = False) -> None:
        """Switches the attention backend: "auto", or a name of rose.attention.BACKENDS. With
        `defer`, "auto" leaves the backends whose libraries are slow to import for later."""
        spec = dataclasses.replace(self.model.attention_spec, dtype=self.dtype)
        self.attention = create_backend(name, spec, self.device, self.max_input_length, defer)
        if getattr(self, "graphs", None) is not None:
            self.graphs = CudaGraphs(self.graphs.mode, self.graphs.max_graphs, self.attention, self._stream)

    def _prepare_long_batches(self) -> None:
        """Before the first batch the small-batch kernel does not take: waits for the attention
        libraries imported in the background, switches to the full "auto" backend, and runs the
        fidelity check's batches again, the long ones too (falling back as at start if they
        diverge): the full backend comes with graphs of its own."""
        self._long_pending = self._short_pending = False
        if isinstance(self.attention, AutoBackend) and self.attention.deferred:
            try:
                if self._deferred is not None:
                    self._deferred.result()
                else:  # not started yet when a --warmup bucket is long: imported here
                    self.attention.import_deferred()
                self.use_attention("auto")
            except Exception as why:  # noqa: BLE001 - the light backends still serve
                log.warning("the deferred attention backends did not import: %s", why)
            self._deferred = None
        if self._expected is not None and self.fidelity is not None:
            self.fidelity["long_batches"] = fidelity.check(self, self._expected)

    def _check_short_batches(self) -> None:
        """Before the first batch longer than the single-query path takes: the fidelity check of the
        short batches' path, left from start-up (falling back as at start if they diverge)."""
        self._short_pending = False
        if self._expected is not None and self.fidelity is not None:
            self.fidelity["short_batches"] = fidelity.check(self, self._expected, tiers=("short",))

    @property
    def dimensions(self) -> int:
        return int(self.model_dir.config["hidden_size"])

    @property
    def dtype_name(self) -> str:
        if self.matmul_dtype != self.dtype:
            return f"{MIXED} ({_dtype_name(self.matmul_dtype)} matmuls, {_dtype_name(self.dtype)} activations)"
        return _dtype_name(self.dtype)

    @property
    def smallest_bucket(self) -> int | None:
        """Batches of this many tokens or fewer take the fused decoder, under graphs of their own."""
        return self.fused_decoder.max_tokens if self.fused_decoder is not None else None

    @property
    def max_input_length(self) -> int:
        return self.model_dir.max_input_length

    @torch.inference_mode()
    def step(self, input_ids: Any, cu_seqlens: Any) -> LazyTensor:
        """Enqueues one packed batch; returns its pooled float32 vectors [sequences, dim] as a
        LazyTensor without waiting for the device. Normalization and truncation are left to the
        caller, since requests packed together may want different shapes. On the GPU, call it
        with the stream that was current when the engine was made still current (the engine holds
        that stream instead of looking it up each step)."""
        ids, cu = as_int32(input_ids), as_int32(cu_seqlens)
        if self.device.type != "cuda":
            batch = RaggedBatch.from_host(ids, cu, self.device)
            self.attention.plan(batch)
            return LazyTensor(self._forward(batch, self.attention))
        return self._step_cuda(ids, cu)

    def _step_cuda(self, ids: np.ndarray, cu: np.ndarray) -> LazyTensor:
        tokens, sequences = len(ids), len(cu) - 1
        if self._long_pending and not (isinstance(self.attention, AutoBackend) and self.attention.takes_small(tokens)):
            self._prepare_long_batches()  # checks every tier, the short batches' too
        if self._short_pending and tokens > self.smallest_bucket:
            self._check_short_batches()
        # Graphs share one memory pool: the previous result leaves it before the next replay.
        if self._last_copy is not None:
            self._stream.wait_event(self._last_copy)
        # The step's GPU work starts once the host has it enqueued, so the timeline begins after
        # the host's wait: if the host is late, the GPU's wait shows as idle, not as busy.
        self._inputs.wait_free()
        self._timeline.begin(self._stream)
        key = bucket(tokens, sequences, self.smallest_bucket)
        limit = max(self.max_input_length, 256)  # the longest sequence a graph plans for
        fits = key[0] <= self._inputs.max_tokens and key[1] <= self._inputs.max_sequences
        # Only replays' ends are forecast: an eager run's span (JIT, kernel loads on a first hit)
        # says little about the next one's, and a forecast too late makes its waiter oversleep.
        replay: tuple[int, int] | None = None
        # No sequence is longer than the batch, so the offsets' differences (5-12 us of the host
        # on the H200, on a query's path before its launch) are taken only past the limit.
        if self.graphs is not None and fits and (tokens <= limit or _longest(cu) <= limit):
            bound = min(key[0], limit)
            replay = key if self.graphs.captured(key) else None
            batch = self._inputs.fill(ids, cu, key[0], key[1], max_seqlen=bound)
            attention = self.graphs.attention_for(key, batch)
            attention.plan(batch)
            self._inputs.mark_uploaded()
            pooled = self.graphs.run(key, batch, self._forward)[:sequences]
        else:
            if tokens <= self._inputs.max_tokens and sequences <= self._inputs.max_sequences:
                batch = self._inputs.fill(ids, cu, tokens, sequences, max_seqlen=_longest(cu))
            else:  # larger than the static buffers: a one-off upload
                batch = RaggedBatch.from_host(ids, cu, self.device)
            self.attention.plan(batch)
            self._inputs.mark_uploaded()
            pooled = self._forward(batch, self.attention)
        # The copy first: the timeline's bookkeeping (~20 us of the host) can wait, the result cannot.
        lazy = LazyTensor.from_device(pooled, self._copy_stream, self._stream)
        lazy.ready_at = self._timeline.end(self._stream, replay)
        self._last_copy = lazy.done
        return lazy

    def _forward(self, batch: RaggedBatch, attention: AttentionBackend) -> torch.Tensor:
        """Token ids to pooled float32 vectors: the region a CUDA graph captures. A model may pool
        its states itself (Qwen3's one-launch path for single queries does)."""
        if hasattr(self.model, "pooled"):
            return self.model.pooled(batch, attention, self.pooling)
        return pool(self.model.forward(batch, attention), batch, self.pooling)

    def _warm(self, spec: str) -> None:
        """Runs (and, with graphs, captures) the bucket `spec`, written TOKENSxSEQUENCES."""
        try:
            tokens, sequences = (int(x) for x in spec.lower().split("x"))
        except ValueError:
            raise ValueError(f"a warm-up bucket is written TOKENSxSEQUENCES, e.g. 512x8; got {spec!r}") from None
        lengths = np.full(sequences, max(tokens // sequences, 1), dtype=np.int32)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = np.full(int(cu[-1]), 100, dtype=np.int32)
        for _ in range(2):
            self.step(ids, cu).wait()

    def check_fidelity(
        self,
        threshold: float = 0.999,
        weights: dict[str, torch.Tensor] | None = None,
        tiers: tuple[str, ...] = fidelity.TIERS,
    ) -> dict[str, Any]:
        """Checks the serving path against a float32 eager reference; see rose.fidelity. `weights`:
        the checkpoint's tensors if still at hand (else they are read again); `tiers`: which
        batches (fidelity.TIERS). The reference's vectors are kept for a later check, and on disk
        for later starts (fidelity.stored_reference)."""
        fixed = fidelity.sequences(int(self.model_dir.config["vocab_size"]), self.max_input_length)
        vectors, source = fidelity.stored_reference(self, fixed, weights)
        self._expected = fixed, vectors
        return {**fidelity.check(self, self._expected, threshold, tiers), "reference": source}

    def reference_model(self, weights: dict[str, torch.Tensor] | None = None) -> Any:
        """The model again, in float32: the reference of the fidelity check. `weights`: the
        checkpoint's tensors if still at hand (else they are read again)."""
        if weights is None:
            weights = load_weights(self.model_dir.path, self._cls.weight_prefixes, self.device)
        return self._cls(self.model_dir.config, weights, torch.float32, self.device, torch.float32)

    def stats(self) -> dict[str, Any]:
        """The engine's live state, for /info: graphs, fidelity, and the GPU's idle share between
        the steps finished since the last call."""
        out: dict[str, Any] = {
            "attention_backend": self.attention.name,
            "attention_deferred": self.attention.deferred if isinstance(self.attention, AutoBackend) else [],
            "attention_importing": self._deferred is not None and not self._deferred.done(),
            "long_batches_pending": bool(self._long_pending),
            "short_batches_pending": bool(self._short_pending),
            "cuda_graphs": self.graphs.describe() if self.graphs else {"mode": "off"},
            "fidelity": self.fidelity,
            "startup_seconds": self.startup_seconds,
            "fused_decoder": self.fused_decoder.describe() if self.fused_decoder is not None else None,
        }
        if self.device.type == "cuda":
            out["gpu_idle_fraction"] = self._timeline.take_idle_fraction()
        return out

    def describe(self) -> dict[str, Any]:
        """What Tulip reports about this engine (see tulip::EngineInfo)."""
        return {
            "model_id": self.model_dir.model_id,
            "model_type": self.model_dir.model_type,
            "model_path": str(self.model_dir.path),
            "dtype": self.dtype_name,
            "device": str(self.device),
            "attention_backend": self.attention.name,
            "pooling": self.pooling,
            "dimensions": self.dimensions,
            "max_input_length": self.max_input_length,
            "vocab_size": int(self.model_dir.config["vocab_size"]),
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_requests": self.max_batch_requests,
            "tokenizer_json": self.model_dir.tokenizer_json(),
            "template_json": json.dumps(self.model_dir.template()),
            "engine_json": json.dumps({"normalize_by_default": self.model_dir.normalize, **self.stats()}),
        }

    def embed_ids(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        normalize: bool = True,
        dimensions: int | None = None,
        max_batch_tokens: int | None = None,
    ) -> np.ndarray:
        """Embeds token-id sequences (lists or int32 arrays, the faster) in-process, packed into
        batches of at most max_batch_tokens tokens and max_batch_requests sequences."""
        out = []
        budget = max_batch_tokens or self.max_batch_tokens
        pending: LazyTensor | None = None
        for chunk in _pack(sequences, budget, self.max_batch_requests):
            lengths = np.array([len(s) for s in chunk], dtype=np.int32)
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in chunk])
            # The next batch is enqueued before the previous one is waited for, as Tulip does.
            lazy = self.step(ids, cu)
            if pending is not None:
                out.append(torch.from_numpy(pending.wait()))
            pending = lazy
        if pending is not None:
            out.append(torch.from_numpy(pending.wait()))
        if not out:
            return np.zeros((0, dimensions or self.dimensions), dtype=np.float32)
        return shape_vectors(torch.cat(out), dimensions, normalize).numpy()

    def encode(self, texts: Sequence[str], *, prompt_name: str | None = None, **kwargs: Any) -> np.ndarray:
        """Tokenizes `texts` as Ivy does (prompt, truncation to the model's length) and embeds them."""
        prompt = self.model_dir.prompts.get(prompt_name or self.model_dir.default_prompt_name or "", "")
        encodings = self.tokenizer.encode_batch([prompt + t for t in texts])
        return self.embed_ids([e.ids for e in encodings], **kwargs)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (the `tokenizers` package), truncating to the model's length."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self.model_dir.tokenizer_json().decode())
            tokenizer.no_padding()
            tokenizer.enable_truncation(self.max_input_length)
            self._tokenizer = tokenizer
        return self._tokenizer


def _pack(sequences: Sequence[Sequence[int]], max_tokens: int, max_sequences: int) -> list[Sequence[Sequence[int]]]:
    chunks, start, tokens = [], 0, 0
    for i, seq in enumerate(sequences):
        if (tokens + len(seq) > max_tokens or i - start >= max_sequences) and i > start:
            chunks.append(sequences[start:i])
            start, tokens = i, 0
        tokens += len(seq)
    if start < len(sequences):
        chunks.append(sequences[start:])
    return chunks


def _longest(cu_seqlens: np.ndarray) -> int:
    """The longest sequence's length (0 for none)."""
    return int(np.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0


def _in_background(work: Callable[[], None]) -> Future[None]:
    """Runs `work` on a daemon thread; the future says when it is done."""
    future: Future[None] = Future()

    def run() -> None:
        try:
            work()
            future.set_result(None)
        except BaseException as why:  # noqa: BLE001 - handed to whoever looks at the future
            future.set_exception(why)

    threading.Thread(target=run, name="rose-imports", daemon=True).start()
    return future


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
