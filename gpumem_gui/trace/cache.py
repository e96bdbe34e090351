"""Traces cached on disk by (config, run, the worker's code, torch / transformers / peft versions): a repeated
question is answered in milliseconds, and a gpumem whose worker measures differently never reuses an old
answer. Writes are atomic; an unreadable entry is a miss, never an error."""

from __future__ import annotations

import contextlib
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from gpumem_gui.files import atomic_write, cache_root
from gpumem_gui.trace.request import TraceRequest
from gpumem_gui.trace.runner import WORKER_DIR


def cache_dir() -> Path:
    return cache_root() / "trace"


@cache
def worker_digest() -> str:
    """A hash of the worker package's source: what measured a cached result."""
    h = hashlib.sha256()
    for f in sorted((WORKER_DIR / "gpumem_trace_worker").glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_key(request: TraceRequest, versions: dict[str, str]) -> str:
    env = json.dumps({k: versions.get(k) for k in ("torch", "transformers", "peft")}, sort_keys=True)
    return hashlib.sha256(f"{request.key()}|{env}|{worker_digest()}".encode()).hexdigest()


def load(key: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "phases" in doc else None


def store(key: str, result: dict[str, Any]) -> None:
    """Keep ``result``; a cache that cannot be written (read-only home, full disk) only costs a re-trace."""
    folder = cache_dir()
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / f"{key}.json", json.dumps(result))
