"""`--inject-faults`' rules, and which step errors are fatal."""

from __future__ import annotations

import pytest
import torch

from rose.errors import EngineFatal, EngineFault, ModelError
from rose.serving.faults import FaultInjection, is_fatal


def test_rules_parse_and_fire_where_planned() -> None:
    plan = FaultInjection.parse("error@2, fatal@5,oom>100")
    assert plan is not None and plan.describe() == "error@2,fatal@5,oom>100"
    plan.before_step(1)
    with pytest.raises(EngineFault):
        plan.before_step(2)
    with pytest.raises(EngineFatal):
        plan.before_step(5)
    plan.before_batch(100)
    with pytest.raises(torch.OutOfMemoryError):
        plan.before_batch(101)
    assert FaultInjection.parse("") is None and FaultInjection.parse(None) is None


def test_an_unknown_rule_is_refused_by_name() -> None:
    with pytest.raises(ModelError, match="'crash@3'"):
        FaultInjection.parse("error@1,crash@3")


def test_cuda_errors_are_fatal_and_out_of_memory_is_not() -> None:
    assert is_fatal(EngineFatal("x")) and is_fatal(torch.AcceleratorError("illegal address"))
    assert not is_fatal(torch.OutOfMemoryError("oom")) and not is_fatal(RuntimeError("a bug"))
