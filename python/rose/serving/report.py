"""What an engine reports of itself: its description for Tulip (protos/tulip.proto's ModelInfo,
by field name) and its live state for /info."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rose.attention import AutoBackend
from rose.loading.fingerprint import fingerprint

if TYPE_CHECKING:
    from rose.serving.engine import Engine


def stats(engine: Engine) -> dict[str, Any]:
    """The engine's live state: graphs, fidelity, and the GPU's idle share between the steps finished
    since the last call."""
    auto = engine.attention if isinstance(engine.attention, AutoBackend) else None
    fused_qkv = getattr(engine.model, "fused_qkv", None)
    out: dict[str, Any] = {
        "attention_backend": engine.attention.name,
        "attention_deferred": auto.deferred if auto else [],
        "attention_importing": engine.startup.importing,
        "long_batches_pending": engine.startup.long_pending,
        "short_batches_pending": engine.startup.short_pending,
        "cuda_graphs": engine.gpu.describe_graphs() if engine.gpu else {"mode": "off"},
        "fidelity": engine.fidelity,
        "startup_seconds": engine.startup_seconds,
        "fused_decoder": {
            "requested": engine.fused_decoder_requested,
            **(engine.decoder.describe() if engine.decoder else {"kernel": None}),
        },
        "shared_prefix": {
            "enabled": engine.shared_prefix,
            "steps": engine.prefix_steps,
            "tokens_saved": engine.prefix_tokens_saved,
        },
        "fused_swiglu": engine.swiglu.describe(),
        "fused_qk_rope": {**engine.qk_rope.describe(), "weight_copy_bytes": fused_qkv.bytes if fused_qkv else 0},
        "steps": engine.steps_served,
        "oom_splits": engine.oom_splits,
        "injected_faults": engine.faults.describe() if engine.faults else None,
    }
    if engine.gpu is not None:
        out["gpu_idle_fraction"] = engine.gpu.timeline.take_idle_fraction()
    return out


def describe(engine: Engine) -> dict[str, Any]:
    """What the engine serves, by ModelInfo's field names (Tulip reads this dict into that message;
    a key it does not know is an error there)."""
    return {
        "model_id": engine.model_dir.model_id,
        "model_type": engine.model_dir.model_type,
        "model_path": str(engine.model_dir.path),
        "dtype": engine.dtype_name,
        "device": str(engine.device),
        "attention_backend": engine.attention.name,
        "pooling": engine.pooling,
        "dimensions": engine.dimensions,
        "max_input_length": engine.max_input_length,
        "vocab_size": engine.vocab_size,
        "max_batch_tokens": engine.max_batch_tokens,
        "max_batch_requests": engine.max_batch_requests,
        "normalize_by_default": engine.model_dir.normalize and engine.scoring is None,
        "fused_decoder": engine.decoder.name if engine.decoder else "off",
        "task": "score" if engine.scoring else "embed",
        "labels": engine.scoring.labels if engine.scoring else [],
        "type_vocab_size": int(engine.model_dir.config.get("type_vocab_size") or 1),
        "modules": engine.model_dir.modules,
        "weights_fingerprint": fingerprint(engine.model_dir.path),
        "outputs": engine.outputs,
        **engine.token_row_layout,
    }
