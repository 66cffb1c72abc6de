"""`--attention-backend auto` on a GPU: which backends it loads and which one each batch gets,
with stand-ins for the GPU backends so that the choice itself runs anywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rose import attention
from rose.attention import AttentionSpec, AutoBackend, BackendUnavailable
from rose.batch import RaggedBatch

SPEC = AttentionSpec(16, 8, 128, causal=True, dtype=torch.bfloat16)


def stand_in(name: str, loads: bool, loaded: list[str]) -> type:
    class StandIn(attention.SdpaBackend):
        def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
            loaded.append(name)
            if not loads:
                raise BackendUnavailable(f"{name} is not installed")
            super().__init__(spec, device)

    StandIn.name = name
    return StandIn


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch):
    """Installs stand-ins; returns a function taking the names that fail to load and giving
    the names whose loading was tried, in order."""

    def install(failing: set[str]) -> list[str]:
        tried: list[str] = []
        for name in ("fa2", "fa3", "fa4", "torch"):
            monkeypatch.setitem(attention.BACKENDS, name, stand_in(name, name not in failing, tried))
        monkeypatch.setitem(attention.AUTO_TABLE, (128, True), [(64, "fa2"), (float("inf"), "fa3")])
        small = stand_in("triton", "triton" not in failing, tried)
        small.max_tokens = 64
        monkeypatch.setattr(attention, "SmallBatchBackend", small)
        return tried

    return install


def batch(lengths: list[int]) -> RaggedBatch:
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return RaggedBatch.from_host(np.zeros(int(cu[-1]), dtype=np.int32), cu, torch.device("cpu"))


def test_auto_loads_only_the_backends_of_its_table(backends) -> None:
    tried = backends(failing=set())
    auto = AutoBackend(SPEC, torch.device("cpu"))
    assert tried == ["fa2", "fa3", "triton"] and auto.name == "auto(fa2,fa3,triton)"
    assert auto.choose(batch([16] * 8)).name == "fa2"
    assert auto.choose(batch([300, 200])).name == "fa3"


def test_auto_sends_small_batches_to_the_triton_kernel(backends) -> None:
    backends(failing=set())
    auto = AutoBackend(SPEC, torch.device("cpu"))
    assert auto.choose(batch([16])).name == "triton" and auto.choose(batch([8] * 8)).name == "triton"
    assert auto.choose(batch([8] * 8 + [1])).name == "fa2"
    assert AutoBackend(AttentionSpec(12, 12, 64, causal=False), torch.device("cpu")).small is None


def test_auto_falls_back_when_a_table_backend_does_not_load(backends) -> None:
    tried = backends(failing={"fa3", "triton"})
    auto = AutoBackend(SPEC, torch.device("cpu"))
    assert tried == ["fa2", "fa3", "triton"] and list(auto.backends) == ["fa2"] and auto.small is None
    assert auto.choose(batch([16])).name == "fa2"
    assert auto.choose(batch([300, 200])).name == "fa2"


def test_auto_takes_the_first_backend_that_loads_when_the_table_has_none(backends) -> None:
    tried = backends(failing={"fa2", "fa3", "fa4"})
    auto = AutoBackend(SPEC, torch.device("cpu"))
    assert tried == ["fa2", "fa3", "fa4", "torch", "triton"] and list(auto.backends) == ["torch"]


def test_auto_says_why_when_nothing_loads(backends) -> None:
    backends(failing={"fa2", "fa3", "fa4", "torch"})
    with pytest.raises(BackendUnavailable, match="fa3 is not installed"):
        AutoBackend(SPEC, torch.device("cpu"))


def test_reachable_drops_what_the_models_sequences_cannot_reach() -> None:
    table = [(1024, "torch"), (float("inf"), "fa4")]
    assert attention.reachable(table, 256) == [(1024, "torch")]
    assert attention.reachable(table, 1024) == [(1024, "torch")]
    assert attention.reachable(table, 1025) == table


def test_auto_loads_no_backend_that_only_longer_sequences_would_take(backends) -> None:
    tried = backends(failing=set())
    AutoBackend(SPEC, torch.device("cpu"), max_length=64)
    assert tried == ["fa2", "triton"]


def test_deferring_serves_with_the_light_backends_and_imports_the_heavy_ones_later(backends, monkeypatch) -> None:
    tried = backends(failing=set())
    auto = AutoBackend(SPEC, torch.device("cpu"), defer=True)
    assert tried == ["torch", "triton"] and auto.deferred == ["fa2", "fa3"]
    assert auto.choose(batch([300, 200])).name == "torch" and auto.takes_small(64) and not auto.takes_small(65)
    imported = []

    def import_libraries(name: str, loads: bool) -> classmethod:
        def load(cls) -> None:
            imported.append(name)
            if not loads:
                raise BackendUnavailable(f"{name} is not installed")

        return classmethod(load)

    monkeypatch.setattr(attention.BACKENDS["fa2"], "import_libraries", import_libraries("fa2", True))
    monkeypatch.setattr(attention.BACKENDS["fa3"], "import_libraries", import_libraries("fa3", False))
    auto.import_deferred()
    assert imported == ["fa2", "fa3"] and auto.deferred == ["fa2"]


def test_deferring_needs_a_light_backend_to_serve_meanwhile(backends) -> None:
    tried = backends(failing={"torch"})
    auto = AutoBackend(SPEC, torch.device("cpu"), defer=True)
    assert tried == ["torch", "fa2", "fa3", "triton"] and not auto.deferred and list(auto.backends) == ["fa2", "fa3"]


def test_a_graph_buckets_padding_leaves_the_choice_to_the_real_sequences(backends) -> None:
    backends(failing=set())
    auto = AutoBackend(SPEC, torch.device("cpu"))
    # Two sequences of 100 tokens padded to a bucket of 256 tokens in 8 slots, as DeviceInputs.fill
    # makes it: a mean of 32 over the slots, 100 over the real sequences.
    padded = batch([100, 100, 56, 0, 0, 0, 0, 0])
    padded.unpadded = (200, 2)
    assert padded.mean_length == 100 and auto.choose(padded).name == "fa3"
    padded.unpadded = None
    assert auto.choose(padded).name == "fa2"
