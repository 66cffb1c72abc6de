"""What an engine checks at start and what it leaves for later, so that it answers sooner.

With `defer`, a server serves its first requests before all of its paths are checked: online
queries (up to the small-batch attention's tokens) at once, while the attention libraries that
take seconds to import load on a background thread; the first longer batch waits for those
imports and for the check of the long batches. Where single queries have a path of their own
(a fused decoder), start-up checks only that path, and the first batch longer than it takes
waits for the check of the short batches. A check that fails makes the engine fall back to a
plainer path (`Checked.fall_back`) and check again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from rose.attention import AttentionBackend, AutoBackend
from rose.runtime.background import in_background
from rose.serving import fidelity

log = logging.getLogger(__name__)

Reference = Callable[[], tuple[np.ndarray, str]]
"""The reference's vectors of the fixed sequences, and where they came from ("computed" or "stored")."""


class Checked(Protocol):
    """The engine as the start-up checks see it."""

    attention: AttentionBackend

    @property
    def path(self) -> str: ...

    @property
    def smallest_bucket(self) -> int | None: ...

    def pooled_states(self, sequences: Sequence[Sequence[int]]) -> np.ndarray: ...

    @property
    def state_scores(self) -> fidelity.Scores | None: ...

    @property
    def serves_fp8(self) -> bool: ...

    def use_attention(self, name: str, defer: bool = False) -> None: ...

    def fall_back(self) -> bool: ...


class Startup:
    """The fidelity check's state: the reference's vectors, the report for /info, and the tiers
    (fidelity.TIERS) left to check before the first batch they serve."""

    def __init__(self, engine: Checked, checks: bool, defer: bool) -> None:
        self._engine = engine
        self._checks = checks
        self.threshold = fidelity.THRESHOLD
        auto = engine.attention if isinstance(engine.attention, AutoBackend) else None
        self.long_pending = defer and auto is not None and bool(auto.small or auto.deferred)
        self.short_pending = defer and checks and engine.smallest_bucket is not None
        self.fidelity: dict[str, Any] | None = None
        self._expected: tuple[list[list[int]], np.ndarray] | None = None
        self._source = "computed"
        self._imports: Future[None] | None = None

    @property
    def pending(self) -> bool:
        """True while a batch may still have to wait for a check (read on every step)."""
        return self.long_pending or self.short_pending

    @property
    def importing(self) -> bool:
        return self._imports is not None and not self._imports.done()

    def check(self, fixed: list[list[int]], reference: Reference) -> None:
        """The check at start, of the tiers not left for later; `reference`: the float32 vectors
        of the `fixed` sequences and where they came from ("computed" or "stored")."""
        if not self._checks:
            return
        left = 2 if self.short_pending else 1 if self.long_pending else 0
        self.fidelity = self.verify(fixed, reference, fidelity.TIERS[: len(fidelity.TIERS) - left]).report()

    def verify(self, fixed: list[list[int]], reference: Reference, tiers: tuple[str, ...]) -> fidelity.Verdict:
        """Checks `tiers` against the reference's vectors of `fixed` (computed by `reference` the
        first time, then kept for the checks left for later)."""
        if self._expected is None:
            vectors, self._source = reference()
            self._expected = fixed, vectors
        verdict = self.check_tiers(tiers)
        verdict.reference = self._source
        return verdict

    def start_imports(self) -> None:
        """Imports the attention backends left for later on a background thread."""
        auto = self._engine.attention
        if self.long_pending and isinstance(auto, AutoBackend) and auto.deferred:
            self._imports = in_background(auto.import_deferred)
            log.info("importing the attention backends %s in the background", ", ".join(auto.deferred))

    def before_step(self, tokens: int, takes_small: bool) -> None:
        """The checks a batch of `tokens` waits for (`takes_small`: the small-batch kernel takes it)."""
        if self.long_pending and not takes_small:
            self._prepare_long_batches()  # checks every tier, the short batches' too
        smallest = self._engine.smallest_bucket
        if self.short_pending and smallest is not None and tokens > smallest:
            self.short_pending = False
            if self._expected is not None and self.fidelity is not None:
                self.fidelity["short_batches"] = self.check_tiers(("short",)).report()

    def _prepare_long_batches(self) -> None:
        """Waits for the background imports, switches to the full "auto" backend (with graphs of
        its own), and checks every tier again."""
        self.long_pending = self.short_pending = False
        engine = self._engine
        if isinstance(engine.attention, AutoBackend) and engine.attention.deferred:
            try:
                if self._imports is not None:
                    self._imports.result()
                else:  # not started yet when a --warmup bucket is long: imported here
                    engine.attention.import_deferred()
                engine.use_attention("auto")
            except Exception as why:  # noqa: BLE001 - the light backends still serve
                log.warning("the deferred attention backends did not import: %s", why)
            self._imports = None
        if self._expected is not None and self.fidelity is not None:
            self.fidelity["long_batches"] = self.check_tiers(fidelity.TIERS).report()

    def check_large(self, min_tokens: int, path: str) -> fidelity.Verdict | None:
        """Checks the path of large steps (`path` names it) against the reference kept by `check`:
        the fixed sequences repeated into one batch of at least `min_tokens`, whose vectors are
        the reference's again. No fallback (the caller drops what it added); None where start-up
        checks nothing. The report goes to /info's fidelity.large_batches."""
        if self._expected is None or self.fidelity is None:
            return None
        fixed, vectors = self._expected
        copies = -(-min_tokens // sum(map(len, fixed)))
        verdict = fidelity.measure(self._engine.pooled_states, path, fixed * copies, np.tile(vectors, (copies, 1)),
                                   ("long",), None, self.threshold, self._engine.state_scores)  # fmt: skip
        self.fidelity["large_batches"] = verdict.report()
        log.info("fidelity check of %s: %s", path, verdict.describe())
        return verdict

    def check_tiers(self, tiers: tuple[str, ...]) -> fidelity.Verdict:
        """Checks the engine's path on `tiers` against the reference kept by `check`, falling back
        to plainer paths while it diverges."""
        assert self._expected is not None
        engine, (fixed, vectors) = self._engine, self._expected
        fallbacks = []
        while True:
            verdict = fidelity.measure(engine.pooled_states, engine.path, fixed, vectors, tiers,
                                       engine.smallest_bucket, self.threshold, engine.state_scores)  # fmt: skip
            if verdict.passed:
                break
            if verdict.states_hold and not engine.serves_fp8:
                # Only a score model's scores miss, from 16-bit rounding that no plainer path
                # (graphs off, torch's attention) changes: served as it is, and said.
                log.warning("the path %s keeps the states but not the scores (%s)", verdict.path, verdict.describe())
                break
            log.warning("the path %s diverges from float32 (%s); not serving it", verdict.path, verdict.describe())
            kept = ("path", "worst_cosine", "worst_score_error")
            fallbacks.append({key: value for key, value in verdict.report().items() if key in kept})
            if not engine.fall_back():
                break
        verdict.fallbacks = fallbacks
        log.info(
            "fidelity check: %s against float32 over %d sequences (%s)",
            verdict.describe(),
            verdict.sequences,
            verdict.path,
        )
        return verdict
