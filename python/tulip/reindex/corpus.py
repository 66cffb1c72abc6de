"""Reading a corpus: JSON Lines (an id and a text field), Parquet, or plain text (one document a
line, its 0-based line number the id; blank lines are skipped); gzip too. Shards are contiguous
ranges, so that the shards' outputs read in shard order are the corpus in its order."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

FORMATS = ("jsonl", "parquet", "text")


@dataclass(frozen=True)
class Corpus:
    """Where the documents are and how to read them."""

    path: Path
    format: str
    id_field: str = "id"
    text_field: str = "text"

    @classmethod
    def open(cls, path: str | Path, format: str = "auto", id_field: str = "id", text_field: str = "text") -> Corpus:
        """`format` auto reads the file's suffix: .jsonl/.json, .parquet, anything else as text."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"the corpus {path} is not a file")
        if format == "auto":
            suffixes = [s for s in path.suffixes if s != ".gz"]
            last = suffixes[-1] if suffixes else ""
            format = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}.get(last, "text")
        if format not in FORMATS:
            raise ValueError(f"the corpus format must be one of {', '.join(FORMATS)} (or auto), not {format!r}")
        return cls(path, format, id_field, text_field)

    def count(self) -> int:
        """How many documents it holds (Parquet's from its footer; the others by a pass over the lines)."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).metadata.num_rows
        with self._lines() as lines:
            return sum(1 for line in lines if line.strip())

    def documents(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, str]]:
        """(id, text) of documents [start, stop), in order; ids as strings."""
        for index, (doc_id, text) in enumerate(self._all()):
            if stop is not None and index >= stop:
                return
            if index >= start:
                yield doc_id, text

    def _all(self) -> Iterator[tuple[str, str]]:
        if self.format == "parquet":
            yield from self._parquet()
            return
        with self._lines() as lines:
            if self.format == "text":
                for number, line in enumerate(lines):
                    if line.strip():
                        yield str(number), line.rstrip("\n")
                return
            for number, line in enumerate(lines, 1):
                if line.strip():
                    yield self._record(json.loads(line), f"{self.path}:{number}")

    def _parquet(self) -> Iterator[tuple[str, str]]:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(self.path).iter_batches(columns=[self.id_field, self.text_field]):
            ids, texts = batch.column(self.id_field).to_pylist(), batch.column(self.text_field).to_pylist()
            for doc_id, text in zip(ids, texts, strict=True):
                yield self._record({self.id_field: doc_id, self.text_field: text}, str(self.path))

    def _record(self, record: dict, where: str) -> tuple[str, str]:
        if not isinstance(record, dict) or self.id_field not in record or self.text_field not in record:
            raise ValueError(f"{where}: a record needs the fields {self.id_field!r} and {self.text_field!r}")
        text = record[self.text_field]
        if not isinstance(text, str):
            raise ValueError(f"{where}: {self.text_field!r} must be a string")
        return str(record[self.id_field]), text

    def _lines(self) -> IO[str]:
        if self.path.suffix == ".gz":
            return gzip.open(self.path, "rt", encoding="utf-8")
        return self.path.open(encoding="utf-8")


def shard_range(count: int, shard: int, shards: int) -> range:
    """The documents of shard `shard` of `shards` (0-based): contiguous, disjoint, covering all."""
    if not 0 <= shard < shards:
        raise ValueError(f"--shard {shard}/{shards}: the index must be in [0, {shards})")
    return range(count * shard // shards, count * (shard + 1) // shards)


def parse_shard(value: str) -> tuple[int, int]:
    """`I/N` as (I, N)."""
    try:
        index, total = (int(part) for part in value.split("/"))
    except ValueError:
        raise ValueError(f"--shard must read I/N (such as 0/4), not {value!r}") from None
    if total < 1 or not 0 <= index < total:
        raise ValueError(f"--shard {value}: need 0 <= I < N")
    return index, total
