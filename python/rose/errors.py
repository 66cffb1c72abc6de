"""The engine's errors by kind. Tulip maps each kind to one gRPC status (crates/native reads the
class's `kind`), so a caller learns whose fault a failure is without parsing its message."""

from __future__ import annotations


class RoseError(Exception):
    """Base of ROSE's errors; `kind` names it across the Rust boundary."""

    kind = "fault"


class InvalidInput(RoseError, ValueError):
    """The batch cannot be served as sent (the caller's mistake): a token id outside the
    vocabulary, a sequence over the model's limit, an empty batch."""

    kind = "invalid_input"


class ModelError(RoseError, ValueError):
    """The model folder or the engine's settings cannot be served: an unknown architecture or
    pooling, a missing file, a flag value the engine does not know."""

    kind = "model"


class EngineFault(RoseError, RuntimeError):
    """A step failed for a reason that is not the caller's (a kernel error, a bug)."""

    kind = "fault"


class EngineFatal(RoseError, RuntimeError):
    """A step failed and left the device unusable (a sticky CUDA error): the process must restart."""

    kind = "fatal"


class Overloaded(RoseError, RuntimeError):
    """The device has no room for the batch now (out of memory); a smaller or later one may fit."""

    kind = "overloaded"
