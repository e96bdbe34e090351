"""Traces cached on disk by (config, run, torch / transformers / peft versions): a repeated question is
answered in milliseconds. Writes are atomic (a temporary file renamed into place); an unreadable entry is a
miss, never an error."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir

from gpumem_gui.trace.request import TraceRequest


def cache_dir() -> Path:
    return Path(user_cache_dir("gpumem", appauthor=False)) / "trace"


def cache_key(request: TraceRequest, versions: dict[str, str]) -> str:
    env = json.dumps({k: versions.get(k) for k in ("torch", "transformers", "peft")}, sort_keys=True)
    return hashlib.sha256(f"{request.key()}|{env}".encode()).hexdigest()


def load(key: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "phases" in doc else None


def store(key: str, result: dict[str, Any]) -> None:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        Path(tmp).unlink(missing_ok=True)
