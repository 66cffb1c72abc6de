"""The ROSE engine: a model, an attention backend and pooling behind one step() call."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose.attention import create_backend
from rose.batch import RaggedBatch
from rose.lazy import LazyTensor
from rose.model_dir import POOLING_MODES, ModelDir
from rose.models import model_class
from rose.pooling import pool, shape_vectors
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
    ) -> None:
        self.model_dir = ModelDir.open(model)
        self.device = resolve_device(device)
        self.dtype, self.matmul_dtype = resolve_dtype(dtype, self.device)
        self.pooling = pooling or self.model_dir.pooling
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {self.pooling!r}; use {', '.join(POOLING_MODES)}")
        cls = model_class(self.model_dir.model_type)
        weights = load_weights(self.model_dir.path, cls.weight_prefixes)
        self.model = cls(self.model_dir.config, weights, self.dtype, self.device, self.matmul_dtype)
        self.use_attention(attention_backend)
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._tokenizer: Any = None
        log.info(
            "ROSE serves %s (%s) on %s in %s with %s attention and %s pooling",
            self.model_dir.model_id,
            self.model_dir.model_type,
            self.device,
            self.dtype_name,
            self.attention.name,
            self.pooling,
        )

    def use_attention(self, name: str) -> None:
        """Switches the attention backend: "auto", or a name of rose.attention.BACKENDS."""
        spec = dataclasses.replace(self.model.attention_spec, dtype=self.dtype)
        self.attention = create_backend(name, spec, self.device)

    @property
    def dimensions(self) -> int:
        return int(self.model_dir.config["hidden_size"])

    @property
    def dtype_name(self) -> str:
        if self.matmul_dtype != self.dtype:
            return f"{MIXED} ({_dtype_name(self.matmul_dtype)} matmuls, {_dtype_name(self.dtype)} activations)"
        return _dtype_name(self.dtype)

    @property
    def max_input_length(self) -> int:
        return self.model_dir.max_input_length

    @torch.inference_mode()
    def step(self, input_ids: Any, cu_seqlens: Any) -> LazyTensor:
        """Enqueues one packed batch; returns its pooled float32 vectors [sequences, dim] as a
        LazyTensor without waiting for the device. Normalization and truncation are left to the
        caller, since requests packed together may want different shapes."""
        batch = RaggedBatch.from_host(input_ids, cu_seqlens, self.device)
        self.attention.plan(batch)
        hidden = self.model.forward(batch, self.attention)
        return LazyTensor.from_device(pool(hidden, batch, self.pooling), self._copy_stream)

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
            "tokenizer_json": self.model_dir.tokenizer_json(),
            "template_json": json.dumps(self.model_dir.template()),
            "engine_json": json.dumps({"normalize_by_default": self.model_dir.normalize}),
        }

    def embed_ids(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        normalize: bool = True,
        dimensions: int | None = None,
        max_batch_tokens: int = 16384,
    ) -> np.ndarray:
        """Embeds token-id sequences in-process, packed into batches of at most max_batch_tokens."""
        out = []
        for chunk in _pack(sequences, max_batch_tokens):
            lengths = np.array([len(s) for s in chunk], dtype=np.int32)
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            ids = np.fromiter((t for s in chunk for t in s), dtype=np.int32, count=int(cu[-1]))
            out.append(torch.from_numpy(self.step(ids, cu).wait()))
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


def _pack(sequences: Sequence[Sequence[int]], max_tokens: int) -> list[Sequence[Sequence[int]]]:
    chunks, start, tokens = [], 0, 0
    for i, seq in enumerate(sequences):
        if tokens + len(seq) > max_tokens and i > start:
            chunks.append(sequences[start:i])
            start, tokens = i, 0
        tokens += len(seq)
    if start < len(sequences):
        chunks.append(sequences[start:])
    return chunks


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
