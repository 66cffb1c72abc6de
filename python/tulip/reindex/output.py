"""Writing vectors in parts that are finished or absent: each part (one window of a shard's
documents) is written to a temporary name and renamed, so an interrupted run leaves no half part
and a resumed one redoes only the unfinished ones."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OUTPUT_FORMATS = ("parquet", "npy")
OUTPUT_DTYPES = ("float32", "float16", "int8", "binary")


@dataclass(frozen=True)
class Layout:
    """Where one shard's parts go, and the settings a resumed run must share."""

    folder: Path
    shard: int
    shards: int
    format: str
    settings: dict

    def part(self, k: int) -> Path:
        """Part `k`'s vectors file (for npy, its ids sit beside it in a .ids.json)."""
        return self.folder / f"part-{self.shard:05d}-of-{self.shards:05d}-{k:06d}.{self.format}"

    def prepare(self) -> None:
        """Creates the folder and records the settings; refuses a folder an earlier run filled
        with other settings (resuming it would mix two runs' vectors)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.format == "parquet":
            # Slow first steps, taken here rather than by the writer thread while batches are in
            # flight: the import, and pyarrow's import of pandas (where installed) on its first
            # conversion of a Python list, which holds the GIL for about half a second.
            import pyarrow as pa
            import pyarrow.parquet  # noqa: F401

            pa.array([""])

        manifest = self.folder / f"manifest-{self.shard:05d}-of-{self.shards:05d}.json"
        if manifest.exists():
            before = json.loads(manifest.read_text())
            if before != self.settings:
                changed = sorted(k for k in {*before, *self.settings} if before.get(k) != self.settings.get(k))
                raise ValueError(
                    f"{self.folder} holds a run with other settings ({', '.join(changed)}); use another --output"
                )
        else:
            _replace(manifest, json.dumps(self.settings, indent=1, sort_keys=True).encode())

    def done(self, k: int) -> bool:
        return self.part(k).exists()

    def write(self, k: int, ids: list[str], vectors: np.ndarray) -> None:
        """Writes part `k`: the ids and their vectors, in order; the vectors file last."""
        path = self.part(k)
        if self.format == "npy":
            _replace(path.with_suffix(".ids.json"), json.dumps(ids).encode())
            tmp = path.with_name(path.name + ".tmp")
            with tmp.open("wb") as f:
                np.save(f, vectors)
            os.replace(tmp, path)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(vectors.reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
        table = pa.table({"id": pa.array(ids, pa.string()), "embedding": column})
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)


@dataclass(frozen=True)
class Vectors:
    """A finished output read back: ids and vectors in corpus order."""

    ids: list[str]
    vectors: np.ndarray


def read(folder: str | Path) -> Vectors:
    """Every part in `folder`, in shard then part order (the corpus' order)."""
    folder = Path(folder)
    ids: list[str] = []
    arrays: list[np.ndarray] = []
    for path in sorted(folder.glob("part-*")):
        if path.suffix == ".npy":
            ids += json.loads(path.with_suffix(".ids.json").read_text())
            arrays.append(np.load(path))
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            ids += table.column("id").to_pylist()
            column = table.column("embedding").combine_chunks()
            flat = column.flatten().to_numpy(zero_copy_only=False)
            arrays.append(flat.reshape(len(table), -1))
    vectors = np.concatenate(arrays) if arrays else np.zeros((0, 0), np.float32)
    return Vectors(ids, vectors)


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def settings(**values: object) -> dict:
    """The settings of a run as the manifest records them (JSON types only)."""
    return json.loads(json.dumps(values, default=str))
