"""The real Hugging Face Hub client (``huggingface_hub``, a default dependency), outside the pure core.

It reads ``config.json`` with ``hf_hub_download`` (cached by huggingface_hub in its own cache) and the
safetensors headers with ``get_safetensors_metadata``, which issues HTTP range requests for the headers
only (huggingface_hub docs, "get_safetensors_metadata"). Those headers are cached as JSON under
``cache_dir`` so that a model inspected once can be inspected again offline.

Offline is one line that says so and what to do: with ``HF_HUB_OFFLINE=1``, or when the Hub's host cannot
be reached (a quick TCP probe before the first request: huggingface_hub itself retries a failed connection
five times with back-off, ~23 s, printing a warning each time), a repo that nothing has cached is refused
at once. Every cached JSON file is read with a size cap and as a regular file only, and any parse problem
(malformed, nested too deeply, a number over Python's 4,300-digit limit) is one line too.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from gpumem_gui.core import GpumemInputError
from gpumem_gui.files import atomic_write, cache_root

# A config.json is a few KiB (the largest in tests/reference/configs is under 20 KiB); 16 MiB leaves room
# for any real one and stops a runaway file before it is read whole.
MAX_CONFIG_BYTES = 16 << 20
# One safetensors header is at most 100 MB (safetensors' own limit, core/readers/safetensors_header.py);
# the cache holds every shard's header, in practice a few MB even for 160-shard models.
MAX_HEADERS_BYTES = 256 << 20
# huggingface_hub's default endpoint (huggingface_hub/constants.py, _HF_DEFAULT_ENDPOINT)
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0  # a TCP connect to the Hub; huggingface_hub's own HEAD timeout is 10 s (constants.py)
# the variables httpx (and so huggingface_hub) takes a proxy from: a direct probe would prove nothing
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
TRUE_WORDS = ("1", "ON", "YES", "TRUE")  # huggingface_hub/constants.py, ENV_VARS_TRUE_VALUES
WHAT_TO_DO = "give a local config.json or model folder, or a catalog id (gpumem models)"

Probe = Callable[[], str | None]


def _default_cache_dir() -> Path:
    return cache_root() / "hub"


def _atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data))


def read_json_capped(path: Path, limit: int, where: str) -> Any:
    """The JSON value in ``path``: a regular file of at most ``limit`` bytes (never blocks on a FIFO);
    any problem is one :class:`GpumemInputError` at ``where``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise GpumemInputError(f"cannot read: {e.strerror or type(e).__name__}", source=where) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GpumemInputError("not a regular file", source=where)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise GpumemInputError(f"larger than {limit >> 20} MiB; not a plausible JSON file", source=where)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise GpumemInputError("not a UTF-8 text file", source=where) from None
    except json.JSONDecodeError as e:
        raise GpumemInputError(f"malformed JSON at line {e.lineno} column {e.colno}", source=where) from None
    except ValueError:  # int('9' * 4301): Python's int max_str_digits (4,300 by default)
        raise GpumemInputError("a JSON number has more than 4,300 digits", source=where) from None
    except RecursionError:
        raise GpumemInputError("JSON nested too deeply", source=where) from None


def _env_offline() -> bool:
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # huggingface_hub/constants.py, HF_HUB_OFFLINE
    return any(os.environ.get(v, "").upper() in TRUE_WORDS for v in names)


def probe_endpoint(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to ``endpoint``'s host opens within ``timeout`` (or a proxy is set, which
    only the real request can try), else why not, in a few words."""
    if any(os.environ.get(v) for v in PROXY_VARS):
        return None
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"cannot resolve {host}"
    except (OSError, ValueError) as e:
        return f"cannot connect to {host}: {getattr(e, 'strerror', None) or type(e).__name__}"


@contextlib.contextmanager
def _quiet_hub(bars: Any) -> Iterator[None]:
    """huggingface_hub logs every retry as a warning and draws tqdm progress bars (downloads, "Parse
    safetensors files") on stderr; gpumem reports one line instead."""
    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    bars_were_off = bars is None or bars.are_progress_bars_disabled()
    if not bars_were_off:
        bars.disable_progress_bars()
    try:
        yield
    finally:
        log.setLevel(level)
        if not bars_were_off:
            bars.enable_progress_bars()


class HfHubClient:
    """Fetches config.json and safetensors headers of a Hub repo; see the module docstring.

    ``hub_module`` replaces ``huggingface_hub`` (tests); ``probe`` replaces the reachability check (by
    default it runs only against the real module)."""

    def __init__(
        self, cache_dir: Path | None = None, hub_module: ModuleType | None = None, probe: Probe | None = None
    ) -> None:
        self._cache_dir = cache_dir
        self._hub = hub_module
        self._probe = probe
        # huggingface_hub loads its attributes lazily: ``constants`` is there once imported by name
        self._constants: Any = getattr(hub_module, "constants", None)
        self._utils: Any = getattr(hub_module, "utils", None)  # progress bars on/off

    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            self._cache_dir = _default_cache_dir()
        return self._cache_dir

    def _module(self, repo_id: str) -> ModuleType:
        if self._hub is None:
            try:
                self._hub = importlib.import_module("huggingface_hub")
                self._constants = importlib.import_module("huggingface_hub.constants")
                self._utils = importlib.import_module("huggingface_hub.utils")
            except ImportError:
                raise GpumemInputError(
                    "reading models from the Hugging Face Hub needs huggingface_hub, missing from this "
                    "installation: pip install 'gpumem[hub]'",
                    source=repo_id,
                ) from None
        return self._hub

    def _offline_reason(self) -> str | None:
        """Why the Hub cannot be asked now (offline mode, or its host unreachable), or None."""
        if self._probe is not None:
            return self._probe()
        constants = self._constants
        if constants is None:  # a stand-in module (tests) decides by itself
            return None
        if _env_offline() or getattr(constants, "HF_HUB_OFFLINE", False):
            return "HF_HUB_OFFLINE=1 is set"
        return probe_endpoint(getattr(constants, "ENDPOINT", DEFAULT_ENDPOINT))

    def _offline_error(self, repo_id: str, reason: str) -> GpumemInputError:
        fix = "unset it and connect once" if "HF_HUB_OFFLINE" in reason else "connect to the network once"
        return GpumemInputError(
            f"offline ({reason}) and this repo is not cached: {fix} (gpumem caches what it reads), or "
            + WHAT_TO_DO,
            source=repo_id,
        )

    def _explain(self, repo_id: str, exc: Exception) -> GpumemInputError:
        kind = type(exc).__name__
        if kind == "GatedRepoError":
            why = "the repo is gated: accept its license on the Hub and log in (`hf auth login`)"
        elif kind == "RepositoryNotFoundError":
            why = "no such repo on the Hub (or it is private: log in with `hf auth login`)"
        elif kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
            why = "the repo has no config.json"
        elif kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or isinstance(exc, OSError):
            return self._offline_error(repo_id, "the Hub cannot be reached")
        else:
            why = f"the Hub request failed ({kind}: {str(exc)[:80]})"
        return GpumemInputError(why, source=repo_id)

    def _cache_path(self, repo_id: str, what: str) -> Path:
        return self.cache_dir / repo_id.replace("/", "__") / what

    def _cached(self, repo_id: str, what: str, limit: int) -> Any | None:
        path = self._cache_path(repo_id, what)
        if not path.exists():
            return None
        return read_json_capped(path, limit, f"{repo_id} (cached {what})")

    def _hf_cached_config(self, hub: ModuleType, repo_id: str) -> Path | None:
        """config.json from huggingface_hub's own cache (e.g. a model transformers downloaded), no network."""
        try:
            return Path(hub.hf_hub_download(repo_id, "config.json", local_files_only=True))
        except Exception:
            return None

    def _download_config(self, hub: ModuleType, repo_id: str) -> Path:
        reason = self._offline_reason()
        if reason is not None:
            path = self._hf_cached_config(hub, repo_id)
            if path is None:
                raise self._offline_error(repo_id, reason)
            return path
        try:
            with _quiet_hub(self._utils):
                return Path(hub.hf_hub_download(repo_id, "config.json"))
        except Exception as e:
            raise self._explain(repo_id, e) from None

    def fetch_config(self, repo_id: str) -> Mapping[str, Any]:
        hub = self._module(repo_id)
        try:
            path = self._download_config(hub, repo_id)
        except GpumemInputError:
            cached = self._cached(repo_id, "config.json", MAX_CONFIG_BYTES)
            if cached is None:
                raise
            cfg = cached
        else:
            cfg = read_json_capped(path, MAX_CONFIG_BYTES, f"{repo_id}: config.json")
        if not isinstance(cfg, dict):
            raise GpumemInputError("config.json does not hold a JSON object", source=repo_id)
        _atomic_write_json(self._cache_path(repo_id, "config.json"), cfg)
        return cfg

    def _download_headers(self, hub: ModuleType, repo_id: str) -> dict[str, dict[str, Any]] | None:
        reason = self._offline_reason()
        if reason is not None:
            raise self._offline_error(repo_id, reason)
        try:
            with _quiet_hub(self._utils):
                meta = hub.get_safetensors_metadata(repo_id)
        except Exception as e:
            if type(e).__name__ == "NotASafetensorsRepoError":
                return None
            raise self._explain(repo_id, e) from None
        return {
            fname: {
                name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
                for name, t in fmeta.tensors.items()
            }
            for fname, fmeta in meta.files_metadata.items()
        }

    def fetch_safetensors_headers(self, repo_id: str) -> Mapping[str, Mapping[str, Any]] | None:
        hub = self._module(repo_id)
        what = "safetensors_headers.json"
        try:
            headers = self._download_headers(hub, repo_id)
        except GpumemInputError:
            cached = self._cached(repo_id, what, MAX_HEADERS_BYTES)
            if cached is None:
                raise
            if not isinstance(cached, dict) or not all(isinstance(h, dict) for h in cached.values()):
                where = f"{repo_id} (cached {what})"
                raise GpumemInputError("not a JSON object of headers", source=where) from None
            return cached
        if headers is not None:
            _atomic_write_json(self._cache_path(repo_id, what), headers)
        return headers
