"""ivy-embed on a 2,000-document corpus in three shards (one against the server, one killed in the
middle and resumed), and the Ray Data stage on a local Ray cluster: the server's vectors, in the
corpus' order, every id once."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from support import Server, cosines, varied_texts
from tulip.reindex import read

COUNT = 2000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    texts = varied_texts(COUNT, seed=11)
    ids = [f"doc-{i:05d}" for i in range(COUNT)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for doc_id, text in zip(ids, texts, strict=True):
            f.write(json.dumps({"id": doc_id, "text": text}) + "\n")
    return path, ids, texts


@pytest.fixture(scope="module")
def served(server: Server, corpus: tuple[Path, list[str], list[str]]) -> np.ndarray:
    """The server's own vectors of the corpus' texts."""
    texts = corpus[2]
    rows = []
    for i in range(0, len(texts), 250):
        response = requests.post(
            f"{server.url}/embed", json={"inputs": texts[i : i + 250], "truncate": True}, timeout=600
        )
        assert response.status_code == 200, response.text
        rows += response.json()
    return np.array(rows, dtype=np.float32)


def ivy_embed(corpus: Path, out: Path, *flags: str, log: Path) -> subprocess.Popen:
    command = ["ivy-embed", str(corpus), "--output", str(out), "--device", "cpu", "--window", "100", *flags]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def assert_equals_served(out: Path, ids: list[str], served: np.ndarray) -> None:
    vectors = read(out)
    assert vectors.ids == ids, "ids missing, repeated or out of order"
    assert cosines(vectors.vectors.astype(np.float32), served).min() >= 0.9999


def test_three_shards_one_killed_and_resumed_equal_the_server(
    server: Server, corpus: tuple[Path, list[str], list[str]], served: np.ndarray, tmp_path: Path
) -> None:
    path, ids, _ = corpus
    out = tmp_path / "vectors"
    first = ivy_embed(path, out, "--shard", "0/3", "--server", server.url, log=tmp_path / "shard0.log")
    assert first.wait(timeout=600) == 0, (tmp_path / "shard0.log").read_text()[-3000:]

    second = ivy_embed(path, out, "--shard", "1/3", log=tmp_path / "shard1.log")
    deadline = time.monotonic() + 300
    while len(list(out.glob("part-00001-*.parquet"))) < 2:
        assert second.poll() is None, (tmp_path / "shard1.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "shard 1 wrote no part in 300 s"
        time.sleep(0.05)
    second.send_signal(signal.SIGKILL)
    second.wait(timeout=60)
    parts = len(list(out.glob("part-00001-*.parquet")))
    assert 2 <= parts < 7, f"shard 1 finished ({parts} parts) before it was killed"

    resumed = ivy_embed(path, out, "--shard", "1/3", log=tmp_path / "resumed.log")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    log = (tmp_path / "resumed.log").read_text()
    assert f"({parts * 100} already done)" in log, log[-2000:]

    third = ivy_embed(path, out, "--shard", "2/3", log=tmp_path / "shard2.log")
    assert third.wait(timeout=600) == 0, (tmp_path / "shard2.log").read_text()[-3000:]
    assert not list(out.glob("*.tmp")), "a temporary file was left behind"
    assert_equals_served(out, ids, served)


def test_text_corpus_into_npy_float16_and_binary(
    corpus: tuple[Path, list[str], list[str]], served: np.ndarray, tmp_path: Path
) -> None:
    texts = corpus[2][-200:]  # pooled sentences: no blank or multi-line documents
    path = tmp_path / "corpus.txt"
    path.write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
    for dtype in ("float16", "binary"):
        out, log = tmp_path / dtype, tmp_path / f"{dtype}.log"
        run = ivy_embed(path, out, "--output-format", "npy", "--output-dtype", dtype, log=log)
        assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
        got = read(out)
        assert got.ids == [str(i) for i in range(200)]
        if dtype == "float16":
            assert got.vectors.dtype == np.float16
            assert cosines(got.vectors.astype(np.float32), served[-200:]).min() >= 0.999
        else:
            # Packed sign bits; a value within rounding of 0 may land on either side.
            agree = np.unpackbits(got.vectors, axis=1) == (served[-200:] > 0)
            assert got.vectors.shape == (200, 48) and agree.mean() > 0.999


def test_ray_data_stage_on_a_local_cluster_equals_the_server(
    corpus: tuple[Path, list[str], list[str]], served: np.ndarray
) -> None:
    import ray

    from tulip.ray_data import Embedder

    _, ids, texts = corpus
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)])
        ds = ds.map_batches(Embedder, fn_constructor_kwargs={"device": "cpu"}, concurrency=2, batch_size=250)
        rows = ds.take_all()
    finally:
        ray.shutdown()
    by_id = {row["id"]: np.asarray(row["embedding"], dtype=np.float32) for row in rows}
    assert len(rows) == COUNT and sorted(by_id) == ids
    assert cosines(np.stack([by_id[i] for i in ids]), served).min() >= 0.9999


def test_a_busy_server_s_429s_are_waited_out_not_fatal(
    corpus: tuple[Path, list[str], list[str]], served: np.ndarray, tmp_path: Path
) -> None:
    from support import metric, start_server

    # Two requests at a time, eight sent: most are turned away at first.
    busy = start_server(tmp_path, "--auto-truncate", "--max-concurrent-requests", "2")
    try:
        path, ids, _ = corpus
        out, log = tmp_path / "vectors", tmp_path / "busy.log"
        flags = ("--server", busy.url, "--concurrency", "8", "--batch-size", "25")
        run = ivy_embed(path, out, "--shard", "0/5", *flags, log=log)
        assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
        assert metric(busy.url, 'ivy_errors_total{error_type="overloaded"}') > 0, "no request was turned away"
    finally:
        busy.stop()
    assert_equals_served(out, ids[:400], served[:400])
