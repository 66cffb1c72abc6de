"""The ROSE engine: a model, an attention backend, a fused decoder and pooling behind one step()
call. It composes the parts; each lives in the folder named for it."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose.attention import AttentionBackend, AutoBackend, create_backend
from rose.attention.sdpa import SdpaBackend
from rose.batch import RaggedBatch, as_int32
from rose.decoder.base import build as build_decoder
from rose.errors import EngineFatal, ModelError, Overloaded
from rose.loading import prestart
from rose.loading.model_dir import POOLING_MODES, ModelDir
from rose.loading.weights import load_weights
from rose.models import model_class
from rose.models.dense import DenseModules
from rose.models.multi_vector import expansion_key_lengths, token_head
from rose.models.pooling import pooled_forward
from rose.models.sparse import SpladeHead
from rose.ops.fp8 import fp8_layers
from rose.ops.fused_qk_rope import qk_rope_kernel
from rose.ops.fused_swiglu import swiglu_kernel
from rose.ops.large_steps import LargeStepKernel
from rose.runtime.background import in_background
from rose.runtime.buckets import parse_warmup, warmup_lengths
from rose.runtime.heap import start_trimming
from rose.runtime.shared_prefix import PrefixLayout, shared_prefix
from rose.serving import fidelity, report
from rose.serving.cuda_steps import CudaSteps
from rose.serving.dtypes import dtype_name, resolve_device, resolve_dtype
from rose.serving.faults import FaultInjection, is_fatal
from rose.serving.fidelity import THRESHOLD
from rose.serving.lazy import LazyTensor
from rose.serving.startup import Startup
from rose.serving.task import resolve as resolve_task

log = logging.getLogger(__name__)

STARTUP_PHASES = ("read_weights", "build_model", "attention", "warmup", "fidelity_check")
"""Where start-up time goes, for /info. "read_weights" includes creating the CUDA context (unless
rose.loading.prestart made it while torch imported); "attention", importing its libraries;
"warmup", the --warmup buckets and waiting for Triton's key."""


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
        fused_decoder: str = "auto",
        task: str = "auto",
        default_instruction: str | None = None,
        inject_faults: str | None = None,
        shared_prefix: bool = True,
        fused_swiglu: str = "auto",
        fused_qk_rope: str = "auto",
    ) -> None:
        marks = [time.perf_counter()]
        start_trimming()
        self.model_dir = ModelDir.open(model)
        self.device = resolve_device(device)
        self.dtype, self.matmul_dtype = resolve_dtype(dtype, self.device)
        self.pooling = pooling or self.model_dir.pooling
        if self.pooling not in POOLING_MODES:
            raise ModelError(f"unknown pooling {self.pooling!r}; use {', '.join(POOLING_MODES)}")
        on_gpu = self.device.type == "cuda"
        self.max_batch_tokens = max_batch_tokens or (16384 if on_gpu else 4096)
        self.max_batch_requests = max_batch_requests or 512
        self.fused_decoder_requested = fused_decoder
        self.faults = FaultInjection.parse(inject_faults)
        self.steps_served = 0
        self.oom_splits = 0
        self.prefix_steps = self.prefix_tokens_saved = 0  # steps that read a shared prefix once
        # Triton hashes its installation before its first kernel: on a thread while the weights
        # load (unless rose.loading.prestart did it while torch imported).
        triton_key = in_background(prestart.warm_triton) if on_gpu else None
        self._family = model_class(self.model_dir.model_type)
        # Straight onto the device: the model and the fidelity check's float32 reference are both
        # built from these there, without a second trip over PCIe.
        weights = load_weights(self.model_dir.path, self._family.weight_prefixes, self.device)
        self.scoring = resolve_task(task, self.model_dir, self._family, weights, default_instruction)
        if self.scoring is not None:
            self.pooling = self.scoring.pooling
        dense = DenseModules(self.model_dir.dense, self.device) if self.model_dir.dense else None
        # What a token step runs on every token's state: BGE-M3's ColBERT and lexical heads, or a
        # ColBERT model's Dense modules (which then project tokens, not a pooled vector).
        self.token_head = None if self.scoring else token_head(self.model_dir, dense, self.device)
        self.dense = None if self.model_dir.colbert else dense
        # What runs after the pooled states, outside the graphs: a score head, or Dense modules.
        self._head = self.scoring.head if self.scoring else self.dense
        self.colbert_template = self.model_dir.colbert_template()
        # ColBERT queries' expansion tokens that no token attends to: steps with them take SDPA
        # with the keys cut short (no library kernel here takes per-sequence key lengths).
        self._expansion_attention: SdpaBackend | None = None
        marks.append(time.perf_counter())
        self.model = self._build(weights, self.dtype, self.matmul_dtype)
        self._fp8 = [layer for layer in fp8_layers(self.model) if layer.enabled]
        decoder_weights = getattr(self.model, "decoder_weights", None)
        # The CUDA kernel pools mean, cls and last in its tail; other poolings take the layer-by-layer path.
        requested = fused_decoder if self.pooling in ("mean", "cls", "last") else "off"
        self.decoder = build_decoder(requested, decoder_weights() if decoder_weights else None, self.device)
        marks.append(time.perf_counter())
        self.attention = self._attention(attention_backend, defer_attention)
        colbert = self.model_dir.colbert
        if colbert is not None and colbert.do_query_expansion and not colbert.attend_to_expansion_tokens:
            spec = dataclasses.replace(self.model.attention_spec, dtype=self.dtype)
            self._expansion_attention = SdpaBackend(spec, self.device)
        spec = self.model.attention_spec
        # A causal score model's pairs share the template's head and the query: read once (the
        # last token, which it scores, is always a pair's own).
        causal_last = spec.causal and spec.window is None and self.pooling == "last"
        self.shared_prefix = bool(shared_prefix and self.scoring and causal_last)
        # A decoder's gate/up product with SwiGLU in its epilogue and QKV product with QK-norm and
        # RoPE in its, for large steps; loaded on a thread when the first one comes (rose.ops.large_steps).
        sixteen_bit = self.matmul_dtype == self.dtype
        self.swiglu = swiglu_kernel(fused_swiglu, getattr(self.model, "swiglu_shape", None) if sixteen_bit else None,
                                    self.dtype, self.device)  # fmt: skip
        self.qk_rope = qk_rope_kernel(fused_qk_rope, getattr(self.model, "qkv_shape", None) if sixteen_bit else None,
                                      self.dtype, self.device)  # fmt: skip
        self.gpu: CudaSteps | None = None
        if on_gpu:
            self.gpu = CudaSteps(self.device, self.max_batch_tokens, self.max_batch_requests, cuda_graphs,
                                 max_cuda_graphs, self.attention)  # fmt: skip
        marks.append(time.perf_counter())
        # Anything but float32 throughout differs from the reference: checked on every device.
        checks = verify and (on_gpu or self.dtype != torch.float32 or self.matmul_dtype != torch.float32)
        self.startup = Startup(self, checks, defer_attention)
        if triton_key is not None:
            wait([triton_key])
        for spec in warmup:
            lengths = warmup_lengths(*parse_warmup(spec))
            for _ in range(2):  # with lazy graphs: the eager run, then the capture
                self.embed_ids([[100] * n for n in lengths])
        marks.append(time.perf_counter())
        fixed = fidelity.sequences(self.vocab_size, self.max_input_length)
        self.startup.check(fixed, functools.partial(self._stored_reference, fixed, weights))
        del weights
        marks.append(time.perf_counter())
        self.startup_seconds = {
            k: round(b - a, 3) for k, a, b in zip(STARTUP_PHASES, marks[:-1], marks[1:], strict=True)
        }
        log.info(
            "ROSE serves %s (%s%s) on %s in %s with %s attention, %s pooling, fused decoder %s and CUDA graphs %s; "
            "start-up %s",
            self.model_dir.model_id,
            self.model_dir.model_type,
            f"; modules {', '.join(self.model_dir.modules)}" if self.model_dir.modules else "",
            self.device,
            self.dtype_name,
            self.attention.name,
            self.pooling,
            self.decoder.name if self.decoder else "off",
            self.gpu.describe_graphs()["mode"] if self.gpu else "off",
            ", ".join(f"{k} {v:.2f} s" for k, v in self.startup_seconds.items()),
        )
        self.startup.start_imports()

    def _build(self, weights: dict[str, torch.Tensor], dtype: torch.dtype, matmul_dtype: torch.dtype) -> Any:
        model = self._family(self.model_dir.config, weights, dtype, self.device, matmul_dtype)
        if self.pooling == "splade":
            splade = self.model_dir.splade or {}
            model.splade = SpladeHead(weights, self.model_dir.config, splade.get("pooling_strategy", "max"),
                                      splade.get("activation_function", "relu"), dtype, self.device)  # fmt: skip
        return model

    def _attention(self, name: str, defer: bool = False) -> AttentionBackend:
        spec = dataclasses.replace(self.model.attention_spec, dtype=self.dtype)
        return create_backend(name, spec, self.device, self.max_input_length, defer)

    def use_attention(self, name: str, defer: bool = False) -> None:
        """Switches the attention backend: "auto", or a name of rose.attention.BACKENDS. With
        `defer`, "auto" leaves the backends whose libraries are slow to import for later."""
        self.attention = self._attention(name, defer)
        if self.gpu is not None:
            self.gpu.use_attention(self.attention)

    @property
    def serves_fp8(self) -> bool:
        """Whether the matmuls run in FP8 (the first thing fall_back gives up)."""
        return bool(self._fp8) and self.matmul_dtype != self.dtype

    def fall_back(self) -> bool:
        """A plainer path after a failed fidelity check: 16-bit matmuls instead of FP8, graphs
        off, then torch's attention; False when none is left."""
        if self.serves_fp8:
            for layer in self._fp8:
                layer.enabled = False
            self.matmul_dtype = self.dtype
            if self.gpu is not None:
                self.gpu.use_attention(self.attention)  # the graphs hold the FP8 products
            return True
        if self.gpu is not None and self.gpu.graphs is not None:
            self.gpu.graphs = None
            return True
        if self.gpu is not None and self.attention.name != "torch":
            self.use_attention("torch")
            return True
        return False

    @property
    def path(self) -> str:
        """The serving path, as the fidelity check names it."""
        graphs = self.gpu.describe_graphs()["mode"] if self.gpu else "off"
        return f"{self.attention.name}, {self.dtype_name}, graphs {graphs}"

    @property
    def fidelity(self) -> dict[str, Any] | None:
        """The fidelity check's report (None when it did not run)."""
        return self.startup.fidelity

    @property
    def dimensions(self) -> int:
        """Values a row of step(): the hidden size (the last Dense module's), a score model's
        labels, or a SPLADE model's vocabulary."""
        if self.scoring:
            return len(self.scoring.labels)
        return self.dense.out_features if self.dense else self.pooled_width

    @property
    def pooled_width(self) -> int:
        """Values a pooled state has (before any head): the vocabulary for SPLADE, else the hidden size."""
        return self.model.splade.vocab_size if self.pooling == "splade" else int(self.model_dir.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.model_dir.config["vocab_size"])

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype, self.matmul_dtype)

    @property
    def smallest_bucket(self) -> int | None:
        """Batches of this many tokens or fewer take the fused decoder, under graphs of their own."""
        return self.decoder.max_tokens if self.decoder is not None else None

    @property
    def max_input_length(self) -> int:
        return self.model_dir.max_input_length

    def step(self, input_ids: Any, cu_seqlens: Any, token_type_ids: Any = None, per_token: bool = False) -> LazyTensor:
        """Enqueues one packed batch (`token_type_ids`: one per token id, or None for all 0);
        returns its pooled float32 vectors [sequences, dim], or a score model's logits
        [sequences, labels], as a LazyTensor without waiting for the device. Shaping (truncation,
        normalization, quantization, sigmoid) is left to the caller, since requests packed
        together want different shapes. On the GPU, call it with the stream that was current when
        the engine was made. With `per_token`, a row a token instead: `token_row_layout`."""
        self.steps_served += 1
        if self.faults is not None:
            self.faults.before_step(self.steps_served)
        return self._guarded(input_ids, cu_seqlens, token_type_ids, self._head, per_token)

    @property
    def token_row_layout(self) -> dict[str, int | bool]:
        """What a token's row of a `per_token` step holds, in order: its final hidden state, then
        the multi-vector (BGE-M3's ColBERT head's, a ColBERT model's projection) and BGE-M3's
        lexical weight where the model has them (ModelInfo's names)."""
        head = self.token_head
        return {
            "hidden_size": int(self.model_dir.config["hidden_size"]),
            "multi_vector_dimensions": head.multi_vector_dimensions if head else 0,
            "lexical_weights": bool(head and head.lexical_weights),
            # BGE-M3's head has no vector for the first token (CLS); a ColBERT model keeps it.
            "multi_vector_skips_first": bool(head and head.lexical_weights),
        }

    @property
    def outputs(self) -> list[str]:
        """What Tulip's Encode answers for this model (protos/tulip.proto's Output, in lower case)."""
        if self.scoring is not None:
            return []
        if self.pooling == "splade":
            return ["sparse", "tokens"]
        if self.model_dir.colbert is not None:
            return ["multi_vector", "tokens"]
        return ["dense"] + (["sparse", "multi_vector"] if self.token_head is not None else []) + ["tokens"]

    def _guarded(
        self, input_ids: Any, cu_seqlens: Any, token_type_ids: Any, head: Any, per_token: bool = False
    ) -> LazyTensor:
        """_step, where an out-of-memory splits the batch in two and retries each half (down to
        one sequence, then Overloaded), and an error that leaves the device unusable becomes
        EngineFatal."""
        ids, cu = as_int32(input_ids), as_int32(cu_seqlens)
        types = None if token_type_ids is None else as_int32(token_type_ids)
        try:
            if self.faults is not None:
                self.faults.before_batch(len(ids))
            return self._step(ids, cu, types, head, per_token)
        except torch.OutOfMemoryError as why:
            sequences = len(cu) - 1
            if sequences < 2:
                raise Overloaded(f"a sequence of {len(ids)} tokens does not fit on the device now") from why
            self.oom_splits += 1
            log.warning("out of memory on a step of %d tokens in %d sequences; retrying it in two halves",
                        len(ids), sequences)  # fmt: skip
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            mid, cut = sequences // 2, int(cu[sequences // 2])
            parts = [(ids[:cut], cu[: mid + 1], None if types is None else types[:cut]),
                     (ids[cut:], cu[mid:] - cut, None if types is None else types[cut:])]  # fmt: skip
            return LazyTensor.joined([self._guarded(*part, head, per_token) for part in parts])
        except Exception as why:
            if is_fatal(why) and not isinstance(why, EngineFatal):
                raise EngineFatal(f"the device failed: {why}") from why
            raise

    @torch.inference_mode()
    def _step(self, input_ids: Any, cu_seqlens: Any, token_type_ids: Any, head: Any, per_token: bool) -> LazyTensor:
        ids, cu = as_int32(input_ids), as_int32(cu_seqlens)
        types = None if token_type_ids is None else as_int32(token_type_ids)
        if self.startup.pending:
            auto = self.attention if isinstance(self.attention, AutoBackend) else None
            self.startup.before_step(len(ids), auto is not None and auto.takes_small(len(ids)))
        if self.swiglu.before_step(len(ids)):
            self._take_fused(self.swiglu, lambda kernel: setattr(self.model, "fused_swiglu", kernel))
        if self.qk_rope.before_step(len(ids)):
            self._take_fused(self.qk_rope, self.model.use_fused_qkv)
        forward = self._token_rows if per_token else self._forward
        head = None if per_token else head
        if head is not None and self.shared_prefix and types is None:
            layout = shared_prefix(ids, cu)
            attention = self._key_sharing_attention() if layout is not None else None
            if attention is not None:
                return self._prefix_step(layout, attention, head)
        attention = self._attention_for(ids, cu, per_token)
        if self.gpu is None:
            batch = RaggedBatch.from_host(ids, cu, self.device, types)
            attention.plan(batch)
            rows = forward(batch, attention)
            return LazyTensor(head(rows) if head is not None else rows)
        smallest = None if per_token else self.smallest_bucket
        return self.gpu.step(ids, cu, attention, forward, smallest, self.max_input_length, types, head, per_token)

    def _take_fused(self, fused: LargeStepKernel, install: Callable[[Any], None]) -> None:
        """Large steps take the kernel just loaded (`install` hands it to the model; their graphs are
        captured again), unless the fidelity check of such a step finds the states diverging with
        it (a 16-bit path, like the one it replaces: scores alone missing their bound are that
        rounding's, not the kernel's)."""
        install(fused.kernel)
        self.gpu.forget_graphs(fused.min_tokens)
        verdict = self.startup.check_large(fused.min_tokens, f"{self.path}, {fused.name}")
        if verdict is not None and not verdict.states_hold:
            install(None)
            self.gpu.forget_graphs(fused.min_tokens)
            fused.reject(f"{verdict.describe()} against float32 on large steps")

    def _key_sharing_attention(self) -> AttentionBackend | None:
        """The engine's backend that attends to gathered keys (auto's FlashInfer one), if any."""
        loaded = self.attention.backends if isinstance(self.attention, AutoBackend) else {"": self.attention}
        ranked = sorted(loaded.items(), key=lambda item: item[0] not in ("fa3", "fa2"))
        return next((backend for _, backend in ranked if backend.shares_keys), None)

    def _prefix_step(self, layout: PrefixLayout, attention: AttentionBackend, head: Any) -> LazyTensor:
        """A score step whose sequences share `layout.prefix` tokens: the prefix once, as a
        sequence of its own, then each sequence's rest against the prefix's keys and its own
        (eagerly: the gathered keys' lengths follow each batch)."""
        self.prefix_steps += 1
        self.prefix_tokens_saved += layout.prefix * (len(layout.cu_seqlens) - 3)
        batch = RaggedBatch.from_host(layout.ids, layout.cu_seqlens, self.device)
        batch.positions = torch.from_numpy(layout.positions).to(self.device)
        attention.plan_keys(batch, layout.key_cu_seqlens, torch.from_numpy(layout.key_rows).to(self.device))

        def scores() -> torch.Tensor:  # the prefix's own row goes
            return head(pooled_forward(self.model, batch, attention, self.pooling)[1:])

        return self.gpu.eager(scores) if self.gpu is not None else LazyTensor(scores())

    def _attention_for(self, ids: np.ndarray, cu: np.ndarray, per_token: bool) -> AttentionBackend:
        """The engine's backend, or for a token step with ColBERT queries' expansion tokens SDPA
        with each sequence's keys ending before them (PyLate's attend_to_expansion_tokens false)."""
        if not per_token or self._expansion_attention is None:
            return self.attention
        keys = expansion_key_lengths(ids, cu, self.colbert_template["expansion_id"])
        if keys is None:
            return self.attention
        self._expansion_attention.key_lengths = keys
        return self._expansion_attention

    def _forward(self, batch: RaggedBatch, attention: AttentionBackend) -> torch.Tensor:
        """Token ids to pooled float32 vectors: the region a CUDA graph captures."""
        if self.decoder is not None and batch.num_tokens <= self.decoder.max_tokens:
            return self.decoder(batch, self.pooling)
        return pooled_forward(self.model, batch, attention, self.pooling)

    def _token_rows(self, batch: RaggedBatch, attention: AttentionBackend) -> torch.Tensor:
        """Token ids to a float32 row a token (token_row_layout)."""
        hidden = self.model.forward(batch, attention)
        return self.token_head(hidden, batch) if self.token_head is not None else hidden.float()

    def embed_batches(self, batches: Iterable[Sequence[Sequence[int]]], states: bool = False) -> np.ndarray:
        """step()'s rows of token-id sequences (lists or int32 arrays; `states`: a score model's
        pooled states, not its logits), a step a batch as the caller packed them, each step
        enqueued before the previous one is waited for."""
        head = None if states else self._head
        out, pending = [], None
        for sequences in batches:
            lengths = np.array([len(s) for s in sequences], dtype=np.int32)
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            ids = np.concatenate([np.asarray(s, dtype=np.int32) for s in sequences])
            lazy = self._guarded(ids, cu, None, head)
            if pending is not None:
                out.append(pending.wait().copy())
            pending = lazy
        if pending is not None:
            out.append(pending.wait().copy())
        return np.concatenate(out) if out else np.zeros((0, self.dimensions), dtype=np.float32)

    def embed_ids(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """step()'s rows [len(sequences), dim or labels] of one batch."""
        return self.embed_batches([sequences])

    def pooled_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """Pooled float32 states [len(sequences), hidden] of one batch (a score model's before
        its head): what the fidelity check compares."""
        return self.embed_batches([sequences], states=True)

    @property
    def state_scores(self) -> fidelity.Scores | None:
        """A score model's probabilities from pooled states, through its head as its steps apply
        it, then sigmoid (one label, as /rerank reports it) or softmax (several, as /predict): the
        check compares these, not only the states. None for an embedder."""
        if self.scoring is None:
            return None
        head = self.scoring.head

        def scores(states: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                logits = head(torch.from_numpy(states).to(self.device)).float()
                return (logits.sigmoid() if logits.shape[1] == 1 else logits.softmax(dim=1)).cpu().numpy()

        return scores

    def reference(self, sequences: list[list[int]], weights: dict[str, torch.Tensor] | None = None) -> np.ndarray:
        """Pooled vectors of `sequences` from the model in float32 with eager SDPA attention, the
        fidelity check's reference; `weights`: the checkpoint's tensors if at hand, else read again."""
        if weights is None:
            weights = load_weights(self.model_dir.path, self._family.weight_prefixes, self.device)
        model = self._build(weights, torch.float32, torch.float32)
        return fidelity.reference(model, self.pooling, self.device, sequences)

    def check_fidelity(self, threshold: float = THRESHOLD) -> dict[str, Any]:
        """Checks every tier of the serving path now, falling back while it diverges (start-up
        does this through rose.serving.startup); returns the report."""
        self.startup.threshold = threshold
        fixed = fidelity.sequences(self.vocab_size, self.max_input_length)
        return self.startup.verify(fixed, lambda: self._stored_reference(fixed), fidelity.TIERS).report()

    def _stored_reference(
        self, fixed: list[list[int]], weights: dict[str, torch.Tensor] | None = None
    ) -> tuple[np.ndarray, str]:
        """The reference's vectors of the fixed sequences, or those an earlier start with the
        same inputs kept on disk."""
        key = fidelity.reference_key(self.model_dir.path, self.pooling, self.device.type, fixed)
        shape = (len(fixed), self.pooled_width)
        return fidelity.stored_reference(key, lambda: self.reference(fixed, weights), shape)

    def stats(self) -> dict[str, Any]:
        """The engine's live state, for /info (rose.serving.report)."""
        return report.stats(self)

    def describe(self) -> dict[str, Any]:
        """What the engine serves, as protos/tulip.proto's ModelInfo names it (rose.serving.report)."""
        return report.describe(self)

    def tokenization(self) -> tuple[bytes, str]:
        """tokenizer.json as published, and the template Ivy tokenizes by (JSON): the model's
        prompts and limit, and a score model's pair template."""
        template = self.model_dir.template()
        if self.scoring is not None:
            template["score"] = self.scoring.template
        if self.colbert_template is not None:
            template["multi_vector"] = self.colbert_template
        return self.model_dir.tokenizer_json(), json.dumps(template)
