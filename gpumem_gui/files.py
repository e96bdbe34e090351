"""Files gpumem writes: atomically (a temporary file in the same folder, then ``os.replace``), and under one
cache root. Used by the window's saves, the Hub client's cache and trace mode's cache; no Qt, no core."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir


def cache_root() -> Path:
    """gpumem's cache folder (platformdirs: ``~/.cache/gpumem`` on Linux); each user of it takes a
    subfolder (``hub``, ``trace``)."""
    return Path(user_cache_dir("gpumem", appauthor=False))


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``, so a crash
    or a full disk never leaves a half-written file behind."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
