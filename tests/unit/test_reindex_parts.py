"""ivy-embed's pure parts: shards, windows, length batches, corpus formats, resumable parts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tulip.reindex.corpus import Corpus, parse_shard, shard_range
from tulip.reindex.output import Layout, read
from tulip.reindex.run import length_batches, windows


def test_shards_are_contiguous_disjoint_and_cover_the_corpus() -> None:
    for count in (0, 1, 2, 7, 2000):
        for shards in (1, 2, 3, 8):
            ranges = [shard_range(count, i, shards) for i in range(shards)]
            assert [i for r in ranges for i in r] == list(range(count))
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_length_batches_hold_every_position_once_longest_first() -> None:
    texts = ["a" * n for n in (3, 9, 1, 7, 5)]
    batches = length_batches(texts, 2)
    assert batches == [[1, 3], [4, 0], [2]]
    # A character budget closes a batch early; a document past it sits alone.
    assert length_batches(texts, 3, max_chars=12) == [[1], [3, 4], [0, 2]]
    assert length_batches(texts, 3, max_chars=5) == [[1], [3], [4], [0, 2]]
    assert [list(w) for w in windows(iter(range(5)), 2)] == [[0, 1], [2, 3], [4]]


def test_every_corpus_format_reads_ids_and_texts_in_order(tmp_path: Path) -> None:
    records = [{"id": f"d{i}", "text": f"text {i}"} for i in range(5)]
    jsonl = tmp_path / "c.jsonl.gz"
    with gzip.open(jsonl, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n\n")
    text = tmp_path / "c.txt"
    text.write_text("first\n\nsecond\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"key": [1, 2], "body": ["x", "y"]}), parquet)
    assert Corpus.open(jsonl).format == "jsonl" and Corpus.open(jsonl).count() == 5
    assert list(Corpus.open(jsonl).documents(1, 3)) == [("d1", "text 1"), ("d2", "text 2")]
    assert list(Corpus.open(text).documents()) == [("0", "first"), ("2", "second")]
    assert list(Corpus.open(parquet, id_field="key", text_field="body").documents()) == [("1", "x"), ("2", "y")]
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: a record needs the fields 'id' and 'text'"):
        list(Corpus.open(tmp_path / "bad.jsonl").documents())


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_parts_read_back_in_order_and_a_changed_run_is_refused(tmp_path: Path, fmt: str) -> None:
    vectors = np.arange(12, dtype=np.float16).reshape(4, 3)
    for shard in (1, 0):
        layout = Layout(tmp_path, shard, 2, fmt, {"window": 2})
        layout.prepare()
        for k in (1, 0):
            rows = slice(shard * 2 + k, shard * 2 + k + 1)
            layout.write(k, [f"id{rows.start}"], vectors[rows])
        assert layout.done(0) and layout.done(1) and not layout.done(2)
    out = read(tmp_path)
    assert out.ids == ["id0", "id1", "id2", "id3"]
    np.testing.assert_array_equal(out.vectors, vectors)
    with pytest.raises(ValueError, match=r"other settings \(window\)"):
        Layout(tmp_path, 0, 2, fmt, {"window": 3}).prepare()


def test_a_batch_turned_away_is_offered_again_until_accepted_or_out_of_patience() -> None:
    from tulip.reindex.embedders import until_accepted

    answers = iter([None, None, "vectors"])
    assert until_accepted(lambda: next(answers), "the engine") == "vectors"
    with pytest.raises(RuntimeError, match="the engine turned a batch away for 0 s"):
        until_accepted(lambda: None, "the engine", patience=0.1)
