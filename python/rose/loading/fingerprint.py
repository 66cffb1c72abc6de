"""A digest of a model folder's weights, so that a gateway can tell two replicas that claim one
model name but load different weights (protos/tulip.proto's ModelInfo.weights_fingerprint)."""

from __future__ import annotations

import hashlib
from pathlib import Path

# Files up to this size are hashed whole. Larger ones by their start (a safetensors header names
# every tensor, its dtype and shape) and samples spread over the rest, which keeps the start fast;
# a fine-tune changes every tensor, so samples tell it from its base.
_WHOLE = 512 << 20
_HEAD = 1 << 16
_SAMPLES = 256
_SAMPLE = 1 << 12


def fingerprint(folder: str | Path) -> str:
    """sha256 over each weight file's path, size and bytes (or, past 512 MiB, its first 64 KiB
    and 256 evenly spaced 4 KiB samples), first 16 hex digits."""
    digest = hashlib.sha256()
    root = Path(folder)
    # Sentence-transformers modules (2_Dense/, ...) keep weights in subfolders.
    files = sorted([*root.rglob("*.safetensors"), *root.rglob("*.bin"), *root.rglob("*.pt")])
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root)}:{size}".encode())
        with path.open("rb") as f:
            if size <= _WHOLE:
                digest.update(f.read())
                continue
            digest.update(f.read(_HEAD))
            for k in range(1, _SAMPLES + 1):
                f.seek(size * k // (_SAMPLES + 1))
                digest.update(f.read(_SAMPLE))
    return digest.hexdigest()[:16]
