"""The real Hugging Face Hub client (optional extra ``gpumem[hub]``), outside the pure core.

It reads ``config.json`` with ``hf_hub_download`` (cached by huggingface_hub in its own cache) and the
safetensors headers with ``get_safetensors_metadata``, which issues HTTP range requests for the headers
only (huggingface_hub docs, "get_safetensors_metadata"). Those headers are cached as JSON under
``cache_dir`` so that a model inspected once can be inspected again offline.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from gpumem_gui.core import GpumemInputError
from gpumem_gui.files import atomic_write, cache_root


def _default_cache_dir() -> Path:
    return cache_root() / "hub"


def _atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data))


class HfHubClient:
    """Fetches config.json and safetensors headers of a Hub repo; see the module docstring."""

    def __init__(self, cache_dir: Path | None = None, hub_module: ModuleType | None = None) -> None:
        self._cache_dir = cache_dir
        self._hub = hub_module

    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            self._cache_dir = _default_cache_dir()
        return self._cache_dir

    def _module(self, repo_id: str) -> ModuleType:
        if self._hub is None:
            try:
                self._hub = importlib.import_module("huggingface_hub")
            except ImportError:
                raise GpumemInputError(
                    "reading models from the Hugging Face Hub needs the optional 'hub' extra: "
                    "pip install 'gpumem[hub]'",
                    source=repo_id,
                ) from None
        return self._hub

    def _explain(self, repo_id: str, exc: Exception) -> GpumemInputError:
        kind = type(exc).__name__
        if kind == "GatedRepoError":
            why = "the repo is gated: accept its license on the Hub and log in (`hf auth login`)"
        elif kind == "RepositoryNotFoundError":
            why = "no such repo on the Hub (or it is private)"
        elif kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
            why = "the repo has no config.json"
        elif kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or isinstance(exc, OSError):
            why = "the Hub cannot be reached (offline?) and nothing is cached for this repo"
        else:
            why = f"the Hub request failed ({kind}: {exc})"
        return GpumemInputError(why, source=repo_id)

    def _cache_path(self, repo_id: str, what: str) -> Path:
        return self.cache_dir / repo_id.replace("/", "__") / what

    def fetch_config(self, repo_id: str) -> Mapping[str, Any]:
        hub = self._module(repo_id)
        cached = self._cache_path(repo_id, "config.json")
        try:
            path = Path(hub.hf_hub_download(repo_id, "config.json"))
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:
            if cached.is_file():
                return json.loads(cached.read_text(encoding="utf-8"))
            raise self._explain(repo_id, e) from None
        if not isinstance(cfg, dict):
            raise GpumemInputError("config.json does not hold a JSON object", source=repo_id)
        _atomic_write_json(cached, cfg)
        return cfg

    def fetch_safetensors_headers(self, repo_id: str) -> Mapping[str, Mapping[str, Any]] | None:
        hub = self._module(repo_id)
        cached = self._cache_path(repo_id, "safetensors_headers.json")
        try:
            meta = hub.get_safetensors_metadata(repo_id)
        except Exception as e:
            if type(e).__name__ == "NotASafetensorsRepoError":
                return None
            if cached.is_file():
                return json.loads(cached.read_text(encoding="utf-8"))
            raise self._explain(repo_id, e) from None
        headers: dict[str, dict[str, Any]] = {}
        for fname, fmeta in meta.files_metadata.items():
            headers[fname] = {
                name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
                for name, t in fmeta.tensors.items()
            }
        _atomic_write_json(cached, headers)
        return headers
