"""Where ROSE keeps what it builds once and reuses at later starts."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def cache_dir(*parts: str) -> Path:
    """$ROSE_CACHE_DIR, else $XDG_CACHE_HOME/rose, else ~/.cache/rose; with `parts` appended."""
    root = os.environ.get("ROSE_CACHE_DIR")
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rose"
    return Path(root).joinpath(*parts)


def write_whole(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Writes `path` through `write` whole or not at all (concurrent starts may race); raises
    OSError where it cannot (a read-only home)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as out:
        write(out)
    os.replace(out.name, path)
