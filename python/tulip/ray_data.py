"""A Ray Data stage that embeds a text column (`pip install ivy-tulip-rose[ray]`):

    ds = ray.data.read_parquet("corpus/")
    ds = ds.map_batches(Embedder, fn_constructor_kwargs={"model": "org/name"}, concurrency=4, num_gpus=1,
                        batch_size=512)
    ds.write_parquet("vectors/")

Each actor of the pool loads one engine (Tulip and ROSE in the actor's process, as
`tulip.Client.in_process`); with `num_gpus` Ray gives it its GPU and the engine takes it."""

from __future__ import annotations

from typing import Any

import numpy as np

from tulip import Client
from tulip.reindex.embedders import InProcess


class Embedder:
    """Adds `vector_column` (one row a vector, in `output_dtype`) to batches holding `text_column`.
    `model` and `flags` as `tulip.Client.in_process` takes them (`device`, `dtype`, ...)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        text_column: str = "text",
        vector_column: str = "embedding",
        output_dtype: str = "float32",
        prompt_name: str | None = None,
        dimensions: int | None = None,
        **flags: Any,
    ) -> None:
        self.text_column, self.vector_column = text_column, vector_column
        client = Client.in_process(model, **flags)
        self.embedder = InProcess(client, output_dtype, prompt_name, dimensions)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.text_column not in batch:
            raise KeyError(f"the batch has no column {self.text_column!r}; it has {', '.join(batch)}")
        texts = [str(text) if str(text).strip() else " " for text in batch[self.text_column]]
        vectors, _ = self.embedder.embed(texts)
        return {**batch, self.vector_column: vectors}
