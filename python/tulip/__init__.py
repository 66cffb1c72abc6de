"""Tulip's Python side: `tulip.Client` for the gRPC API, `split_batches` (Tulip's packing rule),
and the `ivy-serve` / `tulip-serve` commands."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from tulip._native import GatewayClient, Overloaded, split_batches

__all__ = ["Client", "Overloaded", "split_batches"]

Inputs = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


class Client:
    """A client of a Tulip server (`ivy-serve` starts one on `--grpc-port`, 50051 by default).

    It runs Ivy's request path in this process (crates/ivy: templating, tokenization with the
    tokenizer and prompts that the server reports, chunking), so it talks to Tulip directly with
    no HTTP in between.
    """

    def __init__(self, address: str = "127.0.0.1:50051", *, timeout: float = 10.0, api_key: str | None = None) -> None:
        """`api_key`: one of the server's --api-key keys, sent with every call (health needs none)."""
        self._native = GatewayClient(address, timeout, api_key=api_key)

    @classmethod
    def in_process(cls, model: str | None = None, **flags: str | int | bool | None) -> Client:
        """A client that loads the model in this process (Tulip and ROSE, no server): `model` as
        `--model` takes it (a folder or a hub id; None: the default model), `flags` as
        `tulip-serve` takes them, by name (`device="cpu"`, `max_batch_tokens=8192`, `dtype=...`)."""
        argv = [] if model is None else ["--model", str(model)]
        for name, value in flags.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not None and value is not False:
                argv += [flag, str(value)]
        client = cls.__new__(cls)
        client._native = GatewayClient.in_process(argv)
        return client

    def embed(
        self,
        inputs: Inputs,
        *,
        normalize: bool = True,
        dimensions: int | None = None,
        truncate: bool = True,
        prompt_name: str | None = None,
        encoding: str = "float32",
    ) -> np.ndarray:
        """Embeds text(s) or token-id list(s); returns [len(inputs), dimensions] float32, or int8
        (round(tanh(x) * 127)) or packed sign bits as uint8 [len(inputs), dimensions / 8] with
        `encoding` int8 or binary.

        Texts longer than the model's limit are truncated, as sentence-transformers does, unless
        `truncate` is False (then they raise ValueError)."""
        if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], np.ndarray):
            inputs = [list(map(int, x)) for x in inputs]
        data, rows, _, _ = self.embed_raw(
            inputs,
            normalize=normalize,
            dimensions=dimensions,
            truncate=truncate,
            prompt_name=prompt_name,
            encoding=encoding,
        )
        dtype = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}[encoding]
        return np.frombuffer(data, dtype=dtype).reshape(rows, -1)

    def embed_raw(self, inputs: Inputs, **options: Any) -> tuple[bytes, int, int, int]:
        """`embed`'s answer as it comes: (packed bytes, rows, dimensions, tokens embedded)."""
        return self._native.embed_raw(inputs, **options)

    def encode(
        self,
        inputs: Inputs,
        outputs: Sequence[str] = ("dense",),
        *,
        normalize: bool = True,
        truncate: bool = True,
        prompt_name: str | None = None,
        top_k: int | None = None,
        min_value: float = 0.0,
        encoding: str = "float32",
        input_type: str | None = None,
    ) -> dict[str, Any]:
        """Several outputs of text(s) or token-id list(s) from one forward pass (`outputs`: any of
        `info()["outputs"]`). Returns, by output: "dense" [len(inputs), dimensions];
        "sparse" {"offsets", "indices", "values"} (input i's entries at offsets[i]:offsets[i + 1]);
        "multi_vector" and "tokens" {"data": [rows, dimensions], "offsets"} (input i's rows
        at offsets[i]:offsets[i + 1]). Sparse vectors keep the `top_k` largest entries of at least
        `min_value`. Dense vectors and multi-vectors are float32, or with `encoding` int8
        (round(tanh(x) * 127)) or binary (packed sign bits, uint8 [rows, dimensions / 8]).
        `input_type` "query" or "document" (the default): a ColBERT model's queries and documents
        are tokenized each their own way; another model takes its prompt of that name if it has one."""
        raw = self._native.encode_raw(inputs, list(outputs), normalize=normalize, truncate=truncate,
                                      prompt_name=prompt_name, top_k=top_k, min_value=min_value,
                                      encoding=encoding, input_type=input_type)  # fmt: skip
        dtypes = {"float32": np.float32, "int8": np.int8, "binary": np.uint8}
        out: dict[str, Any] = {}
        for name in ("dense", "multi_vector", "tokens"):
            if name in raw:
                data, dimensions, offsets, packed = raw[name]
                width = -(-dimensions // 8) if packed == "binary" else dimensions
                rows = np.frombuffer(data, dtype=dtypes[packed]).reshape(-1, width)
                out[name] = rows if name == "dense" else {"data": rows, "offsets": np.asarray(offsets, dtype=np.int64)}
        if "sparse" in raw:
            offsets, indices, values = raw["sparse"]
            out["sparse"] = {"offsets": np.asarray(offsets, dtype=np.int64),
                             "indices": np.asarray(indices, dtype=np.uint32),
                             "values": np.asarray(values, dtype=np.float32)}  # fmt: skip
        return out

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        *,
        instruction: str | None = None,
        truncate: bool = True,
        raw_scores: bool = False,
    ) -> list[tuple[int, float]]:
        """The documents ranked against `query`, best first: (index, score) for the first
        `top_n` (all by default). A score model (cross-encoder, Qwen3-Reranker) scores each pair,
        the sigmoid of its logit unless `raw_scores`; an embedding model answers cosines, a
        ColBERT model MaxSim."""
        return self._native.rerank(
            query, list(documents), top_n=top_n, instruction=instruction, truncate=truncate, raw_scores=raw_scores
        )

    def score(self, pairs: Sequence[tuple[str, str]], *, truncate: bool = True, raw_scores: bool = False) -> np.ndarray:
        """A score model's scores of (text, text) pairs: float32 [len(pairs)] for one label,
        [len(pairs), labels] for several (probabilities unless `raw_scores`)."""
        flat, labels = self._native.predict([(a, b) for a, b in pairs], truncate=truncate, raw_scores=raw_scores)
        scores = np.asarray(flat, dtype=np.float32).reshape(len(pairs), labels)
        return scores[:, 0] if labels == 1 else scores

    def info(self) -> dict[str, Any]:
        """The served model (protos/tulip.proto's ModelInfo): id, type, dtype, device, attention
        backend, pooling, dimensions, limits."""
        return json.loads(self._native.info_json())
