"""CUDA graphs and the LazyTensor on the GPU: replays match eager runs for every bucket touched,
also after a larger batch left its data in the static buffers; the fidelity check falls back."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import rose
from rose import attention
from rose.errors import ModelError
from rose.runtime.buckets import bucket
from support import cosines, save_qwen3, save_tiny_bert


def random_batches(
    rng: np.random.Generator, vocab: int, count: int, max_sequences: int = 40, max_length: int = 256
) -> list[list[list[int]]]:
    """Batches of random sizes, each sent three times (eager warm-up, capture, replay), the big
    ones first so that smaller ones replay over their leftovers."""
    batches = []
    for _ in range(count):
        sequences = int(rng.integers(1, max_sequences))
        lengths = rng.integers(1, max_length, size=sequences)
        batches.append([rng.integers(0, vocab, size=n).tolist() for n in lengths])
    batches.sort(key=lambda b: -sum(map(len, b)))
    return [b for b in batches for _ in range(3)]


@pytest.mark.parametrize("backend", ["auto", "fa2", "fa3", "fa4", "torch"])
def test_replays_match_eager_runs_for_every_bucket(backend: str) -> None:
    graphs = rose.Engine(device="cuda", attention_backend=backend, cuda_graphs="lazy", verify=False)
    eager = rose.Engine(device="cuda", attention_backend=backend, cuda_graphs="off", verify=False)
    rng = np.random.default_rng(7)
    keys = set()
    for sequences in random_batches(rng, 30522, 12):
        keys.add(bucket(sum(map(len, sequences)), len(sequences)))
        got = graphs.embed_ids(sequences)
        expected = eager.embed_ids(sequences)
        assert cosines(got, expected).min() >= 0.9999
    stats = graphs.stats()["cuda_graphs"]
    assert stats["graphs"] == len(keys) and stats["replays"] >= len(keys)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_qwen3_replays_match_eager_runs(tmp_path, monkeypatch, bidirectional: bool) -> None:
    # The short batches (online queries) go to the "triton" attention kernel, at the tiny head_dim too.
    monkeypatch.setattr(attention, "SMALL_BATCH_SHAPES", {(16, not bidirectional)})
    folder = save_qwen3(tmp_path / "qwen3", "tiny", bidirectional=bidirectional)
    graphs = rose.Engine(folder, device="cuda", cuda_graphs="lazy", verify=False)
    eager = rose.Engine(folder, device="cuda", cuda_graphs="off", verify=False)
    # Each path against the float32 reference too, so that a failure says which one is wrong.
    rng = np.random.default_rng(3)
    for sequences in random_batches(rng, 30522, 6) + random_batches(rng, 30522, 6, max_sequences=6, max_length=12):
        expected = eager.reference(sequences)
        worst = {
            "graphs": cosines(graphs.embed_ids(sequences), expected).min(),
            "eager": cosines(eager.embed_ids(sequences), expected).min(),
        }
        assert min(worst.values()) >= 0.999, worst
    assert graphs.attention.small is not None


def test_a_graph_takes_the_attention_backend_of_its_real_sequences(tmp_path, monkeypatch) -> None:
    # Its bucket's padding (one sequence of pad tokens, empty slots) must not pull the mean length
    # under a bound of the table: it once sent bge-base's long steps to the slower kernel.
    monkeypatch.setitem(attention.AUTO_TABLE, (16, False), [(64, "fa2"), (math.inf, "fa3")])
    engine = rose.Engine(save_tiny_bert(tmp_path / "bert", "cls"), device="cuda", cuda_graphs="lazy", verify=False)
    padded, slots = key = bucket(200, 2)
    assert padded / slots <= 64  # the padded batch's mean alone would take fa2
    engine.embed_ids([list(range(1000, 1100))] * 2)
    assert engine.gpu.graphs.graphs[key].attention.name == "fa3"


def test_the_lru_keeps_at_most_max_graphs() -> None:
    engine = rose.Engine(device="cuda", cuda_graphs="eager", max_cuda_graphs=2, verify=False)
    for tokens in (64, 128, 192, 256):
        engine.embed_ids([[101] * (tokens - 1)])
    stats = engine.stats()["cuda_graphs"]
    assert stats["graphs"] == 2 and stats["evicted"] == 2 and stats["captures"] == 4 and stats["pool_bytes"] > 0


def test_graphs_capture_again_after_every_graph_was_forgotten() -> None:
    # What a kernel switch does (the fused SwiGLU, once loaded) when every graph is a large
    # step's: torch cannot capture into a pool whose graphs were all reset.
    engine = rose.Engine(device="cuda", cuda_graphs="eager", verify=False)
    sequences = [[101] * 200] * 24
    first = engine.embed_ids(sequences)
    engine.gpu.forget_graphs(0)
    again = engine.embed_ids(sequences)
    stats = engine.stats()["cuda_graphs"]
    assert stats["captures"] == 2 and stats["forgotten"] == 1 and stats["graphs"] == 1
    assert cosines(again, first).min() >= 0.9999


def test_max_cuda_graphs_below_one_is_refused() -> None:
    with pytest.raises(ModelError, match="at least 1"):
        rose.Engine(device="cuda", max_cuda_graphs=0, verify=False)


def test_warmup_captures_at_start_and_fidelity_is_reported() -> None:
    engine = rose.Engine(device="cuda", warmup=["64x1", "512x8"])
    stats = engine.stats()
    assert stats["cuda_graphs"]["graphs"] >= 2
    assert stats["fidelity"]["worst_cosine"] >= 0.999 and "graphs lazy" in stats["fidelity"]["path"]


def test_a_diverging_path_is_not_served() -> None:
    engine = rose.Engine(device="cuda", attention_backend="fa4", verify=False)
    report = engine.check_fidelity(threshold=1.01)  # nothing can pass: every fallback is tried
    assert [f["path"].split(",")[0] for f in report["fallbacks"]] == ["fa4", "fa4", "torch"]
    assert engine.gpu.graphs is None and engine.attention.name == "torch"


def test_lazy_tensor_waits_on_its_event() -> None:
    engine = rose.Engine(device="cuda", verify=False)
    ids = np.random.default_rng(0).integers(1000, 2000, size=16384, dtype=np.int32)
    lazy = engine.step(ids, np.arange(0, 16385, 128, dtype=np.int32))
    assert isinstance(lazy.done, torch.cuda.Event)
    out = lazy.wait()
    assert lazy.ready() and out.shape == (128, 384) and np.isfinite(out).all()


def test_lazy_tensor_copies_after_the_work_on_its_own_stream_and_leaves_the_current_one() -> None:
    work, copies = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(work):
        values = torch.arange(4096, device="cuda", dtype=torch.float32).reshape(8, 512) * 2
        rose.LazyTensor.from_device(values, copies, work).wait()  # warm: kernels loaded, pinned memory cached
        torch.cuda._sleep(200_000_000)  # ~0.1 s: the values are late, and a copy that did not wait reads old ones
        values.mul_(3)
        lazy = rose.LazyTensor.from_device(values, copies, work)
        assert torch.cuda.current_stream() == work
        assert not lazy.ready()
    expected = (np.arange(4096, dtype=np.float32) * 6).reshape(8, 512)
    np.testing.assert_array_equal(lazy.wait(), expected)


@pytest.mark.parametrize("long_past", [True, False])
def test_lazy_tensor_waits_for_its_values_whatever_the_forecast_said(long_past: bool) -> None:
    values = torch.ones(4, 256, device="cuda")
    copies = torch.cuda.Stream()
    rose.LazyTensor.from_device(values, copies).wait()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU work before the values change
    values.mul_(5)
    lazy = rose.LazyTensor.from_device(values, copies)
    # Forecasts well before the values: one long past (the waiter does not sleep, looks, then
    # blocks) and one 10 ms ahead of the 0.1 s of work (it sleeps, polls, then blocks).
    lazy.ready_at = time.perf_counter() + (-1.0 if long_past else 0.01)
    np.testing.assert_array_equal(lazy.wait(), np.full((4, 256), 5, dtype=np.float32))


def test_engine_forecasts_the_end_of_replays_once_one_replay_finished() -> None:
    engine = rose.Engine(device="cuda", cuda_graphs="lazy", verify=False)
    cu = np.arange(0, 151, 50, dtype=np.int32)  # 3 x 50 tokens: a bucket that start-up did not run
    ids = np.full(150, 1000, dtype=np.int32)
    ahead = []  # each forecast, from the step's call
    for _ in range(6):
        called = time.perf_counter()
        lazy = engine.step(ids, cu)
        ahead.append(None if lazy.ready_at is None else lazy.ready_at - called)
        lazy.wait()
    # Eager, capture, first replay: nothing to forecast from (a replay's span is collected when
    # the next step is closed); then a forecast a replay's time ahead.
    assert ahead[:3] == [None, None, None] and all(a is not None and 0 < a < 0.1 for a in ahead[3:])
