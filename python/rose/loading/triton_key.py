"""Triton's cache key, kept on disk so that a start need not hash Triton's installation.

Before a process's first Triton kernel, Triton hashes its own sources and its shared library
(`triton.runtime.cache.triton_key`, a third of a second or so) to look its compiled kernels up.
Done beside `import torch`, as rose.loading.prestart did, it slowed the import. The key is stored
under a fingerprint of the files it hashes (their paths, sizes and modification times, read
without importing Triton); a start whose fingerprint has a stored key hands that key to Triton
instead of hashing. Any change to those files changes the
fingerprint, so a stored key is never one that Triton would not compute itself."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
from pathlib import Path

from rose.runtime.cache import cache_dir, write_whole

log = logging.getLogger(__name__)

# What triton.runtime.cache.triton_key reads (Triton 3.x), under Triton's package folder.
_HASHED = ("__init__.py", "runtime/cache.py", "compiler", "backends", "language", "_C")


def fingerprint(root: Path | None = None) -> str | None:
    """A digest of the paths, sizes and modification times of the files Triton's key covers, in
    Triton's package folder (`root`, else the installed one's); None without Triton. Does not
    import Triton."""
    if root is None:
        spec = importlib.util.find_spec("triton")
        if spec is None or spec.origin is None:
            return None
        root = Path(spec.origin).parent
    files_hash = hashlib.sha256()
    for part in _HASHED:
        path = root / part
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
        else:
            files = [path] if path.exists() else []
        for file in files:
            stat = file.stat()
            files_hash.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return files_hash.hexdigest()[:32]


installed_fingerprint = functools.cache(fingerprint)
"""fingerprint() of the installed Triton, taken once a process (the prestart thread's is reused)."""


def _stored(digest: str) -> Path:
    return cache_dir("triton-key", digest)


def stored_key(digest: str) -> str | None:
    """The key stored for this fingerprint, if any."""
    try:
        return _stored(digest).read_text()
    except OSError:
        return None


def install(digest: str | None) -> None:
    """Makes Triton's key known to Triton (imported here): the stored one when there is one,
    else Triton computes it (hashing) and it is stored for later starts."""
    from triton.runtime import cache

    key = stored_key(digest) if digest else None
    if key is not None:
        # get_cache_key() looks triton_key up in its module at each call.
        cache.triton_key = functools.cache(lambda: key)
        return
    key = cache.triton_key()
    if digest:
        try:
            write_whole(_stored(digest), lambda out: out.write(key.encode()))
        except OSError as why:  # a read-only home: every start hashes, as Triton would
            log.info("Triton's cache key is not kept (%s)", why)
