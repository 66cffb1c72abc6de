"""The engine's pure choices, without a GPU: graph buckets, warm-up buckets, which fused decoder
to try, which batches the fidelity check runs, and what the start-up checks do with a verdict."""

from __future__ import annotations

import numpy as np
import pytest

from rose import decoder
from rose.errors import ModelError
from rose.runtime.buckets import bucket, parse_warmup, sequence_slots, token_bucket, warmup_lengths
from rose.serving import fidelity
from rose.serving.startup import Startup


@pytest.mark.parametrize(
    "tokens, expected",
    [(1, 64), (64, 64), (65, 128), (1000, 1024), (1024, 1024), (1025, 1280), (16384, 16384), (16385, 16640)],
)
def test_token_buckets_are_multiples_of_64_then_256(tokens: int, expected: int) -> None:
    assert token_bucket(tokens) == expected


def test_sequence_slots_keep_one_for_the_padding() -> None:
    assert [sequence_slots(n) for n in (1, 2, 3, 4, 5, 9, 512)] == [1, 2, 4, 4, 8, 16, 512]
    assert bucket(16, 1) == (64, 2) and bucket(64, 7) == (64, 8) and bucket(300, 8) == (320, 16)
    assert bucket(16, 1, smallest=16) == (16, 2) and bucket(17, 1, smallest=16) == (64, 2)


def test_warmup_buckets_are_read_as_tokens_by_sequences() -> None:
    assert parse_warmup("512x8") == (512, 8) and parse_warmup("64X1") == (64, 1)
    assert warmup_lengths(512, 8) == [64] * 8 and warmup_lengths(10, 3) == [3, 3, 3]
    for bad in ("512", "x8", "8x16", "0x0", "axb"):
        with pytest.raises(ValueError, match="warm-up bucket"):
            parse_warmup(bad)


@pytest.mark.parametrize(
    "requested, on_gpu, sixteen_bit, capability, expected",
    [
        ("auto", True, True, (9, 0), ["cuda", "triton"]),
        ("cuda", True, True, (9, 0), ["cuda"]),
        ("triton", True, True, (8, 0), ["triton"]),
        ("off", True, True, (9, 0), []),
        ("auto", False, True, (0, 0), []),  # the CPU
        ("auto", True, False, (9, 0), []),  # float32 or mixed
        ("auto", True, True, (7, 5), []),  # before Ampere
    ],
)
def test_the_fused_decoder_is_chosen_by_flag_device_and_dtype(
    requested: str, on_gpu: bool, sixteen_bit: bool, capability: tuple[int, int], expected: list[str]
) -> None:
    assert decoder.choose(requested, on_gpu, sixteen_bit, capability) == expected


def test_an_unknown_fused_decoder_names_the_choices() -> None:
    with pytest.raises(ModelError, match="auto, cuda, triton, off"):
        decoder.choose("fast", True, True, (9, 0))


def test_the_fidelity_check_runs_single_queries_alone_short_batches_together_and_then_everything() -> None:
    lengths = [len(s) for s in fidelity.sequences(1000, 512)]

    def batches(smallest: int | None, tier: str) -> list[list[int]]:
        return [lengths[part] for part in fidelity.tier_batches(lengths, tier, smallest)]

    assert batches(16, "single") == [[1], [3], [8], [16]]
    assert batches(None, "single") == []
    assert batches(16, "short") == [[1, 3, 8, 16, 17], [17]]  # up to 64 tokens, and the longest alone
    assert batches(16, "long") == [list(fidelity.LENGTHS)]
    with pytest.raises(ValueError, match="unknown tier"):
        batches(16, "medium")


class Paths:
    """An engine whose vectors match the reference only once it has fallen back `good_after` times."""

    attention = None
    smallest_bucket = None
    state_scores = None
    fp8 = False

    def __init__(self, good_after: int, paths: int) -> None:
        self.fallbacks, self.good_after, self.paths = 0, good_after, paths
        self.vectors = np.random.default_rng(0).standard_normal((len(fidelity.LENGTHS), 8))

    @property
    def path(self) -> str:
        return f"path {self.fallbacks}"

    @property
    def serves_fp8(self) -> bool:  # the first fallback turns FP8 off, as the engine's does
        return self.fp8 and self.fallbacks == 0

    def pooled_states(self, sequences: list[list[int]]) -> np.ndarray:
        rows = [fidelity.LENGTHS.index(len(s)) for s in sequences]
        return self.vectors[rows] * (1 if self.fallbacks >= self.good_after else -1)

    def use_attention(self, name: str, defer: bool = False) -> None:
        raise AssertionError("not deferred")

    def fall_back(self) -> bool:
        if self.fallbacks + 1 >= self.paths:
            return False
        self.fallbacks += 1
        return True


@pytest.mark.parametrize("good_after, paths, passed, tried", [(0, 3, True, 0), (2, 3, True, 2), (5, 3, False, 3)])
def test_a_diverging_path_falls_back_until_one_holds_or_none_is_left(
    good_after: int, paths: int, passed: bool, tried: int
) -> None:
    engine = Paths(good_after, paths)
    fixed = fidelity.sequences(1000, 512)
    startup = Startup(engine, checks=True, defer=False)
    startup.check(fixed, lambda: (engine.vectors, "computed"))
    report = startup.fidelity
    assert (report["worst_cosine"] >= report["threshold"]) == passed
    assert [f["path"] for f in report["fallbacks"]] == [f"path {i}" for i in range(tried)]
    assert report["tiers"] == list(fidelity.TIERS) and report["reference"] == "computed"
    assert not startup.pending


def test_without_checks_nothing_is_measured() -> None:
    engine = Paths(0, 1)
    startup = Startup(engine, checks=False, defer=True)
    startup.check([], lambda: pytest.fail("no reference without checks"))
    assert startup.fidelity is None and not startup.pending


def test_a_score_model_is_checked_on_its_scores_as_well_as_its_states() -> None:
    fixed = fidelity.sequences(1000, 512)
    states = np.random.default_rng(0).standard_normal((len(fixed), 64))
    # The same states, nudged along the head's direction: cosine 0.9999+, yet the scores move.
    head = np.zeros(64)
    head[0] = 1.0
    rows = {len(s): i for i, s in enumerate(fixed)}
    for shift, passed in ((0.005, True), (0.05, False)):
        served = states + shift * head
        run = lambda batch, served=served: served[[rows[len(s)] for s in batch]]  # noqa: E731
        verdict = fidelity.measure(run, "path", fixed, states, ("long",), None, scores=lambda s: s @ head)
        assert verdict.worst_cosine > 0.9999
        assert verdict.worst_score_error == pytest.approx(shift) and verdict.passed == passed
        assert verdict.report()["score_bound"] == fidelity.SCORE_BOUND
    embedder = fidelity.measure(lambda batch: states[[rows[len(s)] for s in batch]], "path", fixed, states,
                                ("long",), None)  # fmt: skip
    assert embedder.worst_score_error is None and "worst_score_error" not in embedder.report()


@pytest.mark.parametrize("fp8", [False, True])
def test_scores_off_by_16_bit_rounding_are_reported_and_only_fp8_falls_back_for_them(fp8: bool) -> None:
    engine = Paths(0, 3)
    engine.fp8 = fp8
    head = np.zeros(8)
    head[0] = 1.0
    engine.state_scores = lambda states: states @ head
    fixed = fidelity.sequences(1000, 512)
    startup = Startup(engine, checks=True, defer=False)
    startup.check(fixed, lambda: (engine.vectors + 0.05 * head, "computed"))  # the states hold, the scores are 0.05 off
    report = startup.fidelity
    assert report["worst_cosine"] >= fidelity.THRESHOLD and report["worst_score_error"] == pytest.approx(0.05)
    assert [f["path"] for f in report["fallbacks"]] == (["path 0"] if fp8 else [])  # FP8 off, nothing more
