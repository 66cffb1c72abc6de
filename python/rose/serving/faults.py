"""Engine faults: the test-only injection behind `--inject-faults`, and what a failed step
becomes. An out-of-memory splits the batch and retries the halves (rose.serving.engine); a CUDA
error leaves the context unusable, so it is fatal: Tulip stops serving and the process exits
for its supervisor to restart it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from rose.errors import EngineFatal, EngineFault, ModelError

_RULE = re.compile(r"^(error|fatal)@(\d+)$|^oom>(\d+)$")


@dataclass
class FaultInjection:
    """Faults to raise, for tests: `error@N` (the Nth step raises an engine fault), `fatal@N` (it
    raises a fault the process cannot survive), `oom>T` (every step of more than T tokens, halves
    of a split batch included, runs out of memory)."""

    errors: set[int] = field(default_factory=set)
    fatal: set[int] = field(default_factory=set)
    oom_above: int | None = None

    @classmethod
    def parse(cls, spec: str | None) -> FaultInjection | None:
        """None for an empty spec; ModelError naming a rule it does not know."""
        if not spec:
            return None
        plan = cls()
        for rule in filter(None, (r.strip() for r in spec.split(","))):
            match = _RULE.match(rule)
            if match is None:
                raise ModelError(f"--inject-faults: unknown rule {rule!r}; use error@N, fatal@N or oom>TOKENS")
            kind, step, tokens = match.groups()
            if tokens is not None:
                plan.oom_above = int(tokens)
            else:
                (plan.errors if kind == "error" else plan.fatal).add(int(step))
        return plan

    def before_step(self, number: int) -> None:
        """Raises the fault planned for the `number`th step (counted from 1), if any."""
        if number in self.errors:
            raise EngineFault(f"fault injected at step {number} (--inject-faults)")
        if number in self.fatal:
            raise EngineFatal(f"fatal fault injected at step {number} (--inject-faults)")

    def before_batch(self, tokens: int) -> None:
        """Raises an out-of-memory for a batch (or part of one) over the planned size."""
        if self.oom_above is not None and tokens > self.oom_above:
            raise torch.OutOfMemoryError(f"out of memory injected for {tokens} tokens (--inject-faults)")

    def describe(self) -> str:
        rules = [f"error@{n}" for n in sorted(self.errors)] + [f"fatal@{n}" for n in sorted(self.fatal)]
        return ",".join(rules + ([f"oom>{self.oom_above}"] if self.oom_above is not None else []))


def is_fatal(error: BaseException) -> bool:
    """Whether a step's exception leaves the device unusable: CUDA errors are sticky (an illegal
    address, a launch failure); out-of-memory is not."""
    return isinstance(error, EngineFatal) or (
        isinstance(error, torch.AcceleratorError) and not isinstance(error, torch.OutOfMemoryError)
    )
