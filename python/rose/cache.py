"""Where ROSE keeps what it builds once and reuses at later starts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """$ROSE_CACHE_DIR, else $XDG_CACHE_HOME/rose, else ~/.cache/rose; with `parts` appended."""
    root = os.environ.get("ROSE_CACHE_DIR")
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rose"
    return Path(root).joinpath(*parts)
