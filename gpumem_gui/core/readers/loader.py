"""``load_model(source)``: one entry point for every way a user names a model.

``source`` may be a catalog id (``Llama-3.1-8B`` or ``meta-llama/Llama-3.1-8B``), a ``config.json``, a model
folder, a ``.safetensors`` file, a sharded folder with ``model.safetensors.index.json``, a ``.gguf`` file,
or a Hugging Face Hub id. Local paths win over catalog ids, catalog ids over hub ids.

The result pairs the architecture (:class:`ModelSpec`, when one can be known) with the exact weight
inventory read from file headers (when files were given): the headers' bytes always win over formulas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError, clip
from gpumem_gui.core.readers.catalog import catalog_config, find_model
from gpumem_gui.core.readers.checkpoint_quant import checkpoint_format, checkpoint_quantization
from gpumem_gui.core.readers.generic import NotModelled
from gpumem_gui.core.readers.hf_config import load_config_file, spec_from_config
from gpumem_gui.core.readers.hub import HubClient, looks_like_hub_id
from gpumem_gui.core.readers.reading import kind, listing, read_json_file
from gpumem_gui.core.readers.safetensors import (
    INDEX_NAME,
    inventory_from_safetensor_headers,
    inventory_from_safetensors,
)
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.spec.model import Frozen, ModelSpec, Provenance
from gpumem_gui.core.spec.params import ParamCounts, count_params

SourceKind = str
_UNKNOWN_NOTE = (
    "the architecture is not modelled, not even approximately: no analytic estimate (trace mode measures it)"
)


class LoadedModel(Frozen):
    """A model as gpumem knows it: architecture, exact parameter counts, and file-header weights."""

    source: str
    source_kind: SourceKind = Field(description="catalog | config.json | folder | safetensors | gguf | hub")
    spec: ModelSpec | None
    params: ParamCounts | None
    weights: WeightsInventory | None = None
    notes: tuple[str, ...] = ()
    config: dict[str, Any] | None = Field(
        None,
        description="the config.json the architecture was read from (for a GGUF file: its metadata mapped "
        "onto one); what trace mode builds the real model from",
    )

    @property
    def name(self) -> str:
        return self.spec.name if self.spec else Path(self.source).name

    @property
    def checkpoint_weights(self) -> str | None:
        """The weight format the config's ``quantization_config`` names (gpt-oss MXFP4 experts, fp8 blocks:
        :func:`~gpumem_gui.core.readers.checkpoint_quant.checkpoint_format`): the bytes of the checkpoint as
        published, the default when no weight files were read."""
        return checkpoint_format(self.config, f"{self.source} (config.json)")

    @property
    def default_weights(self) -> str:
        """The weight format a run of this model takes unless one is chosen: its own weight ``file``s when
        they were read, else the format as published (:attr:`checkpoint_weights`), else bf16."""
        return "file" if self.weights is not None else self.checkpoint_weights or "bf16"

    @property
    def checkpoint_quantization(self) -> str | None:
        """How the checkpoint's weights are quantized (its format id, else the config's ``quant_method``), or
        None for an unquantized checkpoint: a runtime's ``--dtype`` casts only an unquantized one's
        weights."""
        return checkpoint_quantization(self.config, f"{self.source} (config.json)")


_default_hub_client: Callable[[], HubClient] | None = None


def set_default_hub_client(factory: Callable[[], HubClient] | None) -> None:
    """Register how to make a hub client when a caller passes none (the package root does this)."""
    global _default_hub_client
    _default_hub_client = factory


def _loaded(
    source: str,
    kind: str,
    spec: ModelSpec | None,
    weights: WeightsInventory | None = None,
    notes: tuple[str, ...] = (),
    config: Any = None,
) -> LoadedModel:
    checkpoint_format(config, f"{source} (config.json)")  # a bad quantization_config fails the load
    return LoadedModel(
        source=source,
        source_kind=kind,
        spec=spec,
        params=count_params(spec) if spec is not None else None,
        weights=weights,
        notes=notes,
        config=dict(config) if isinstance(config, Mapping) else None,
    )


def _spec_of(load: Callable[[], ModelSpec], unknown_ok: bool) -> ModelSpec | None:
    """The spec ``load`` reads, or None for an architecture the readers do not model and the generic decoder
    cannot stand in for, when the caller accepts that (trace mode builds such models from their config with
    transformers itself). An unknown type with the standard fields gets an approximate spec instead."""
    try:
        return load()
    except NotModelled:  # not even the generic decoder stands in (readers/generic.py)
        if unknown_ok:
            return None
        raise


def _sibling_config(folder: Path, unknown_ok: bool) -> tuple[ModelSpec | None, Any, tuple[str, ...]]:
    """The spec and config of ``folder/config.json`` (None, None without one), and the notes on them. Beside
    weight files (``unknown_ok``), a config the readers cannot model leaves the weights-only view, its reason
    as the note (the headers' bytes are exact whatever the architecture)."""
    cfg = folder / "config.json"
    if kind(cfg) != "file":
        return None, None, ()
    config = read_json_file(cfg)
    try:
        return load_config_file(cfg), config, ()
    except NotModelled as e:
        if not unknown_ok:
            raise
        return None, config, (f"weights only: {e.message}",)


_MODEL_FILE_SUFFIXES = (".safetensors", ".gguf", ".safetensors.index.json", "config.json")


def _stray_notes(entries: list[tuple[str, str]]) -> tuple[str, ...]:
    """A note for entries named like model files that are no regular files (a folder ``x.safetensors``, a
    FIFO ``config.json``): they are ignored, and the reader says so."""
    stray = [n for n, k in entries if k != "file" and n.endswith(_MODEL_FILE_SUFFIXES)]
    if not stray:
        return ()
    shown = ", ".join(clip(n, 40) for n in stray[:3]) + (
        f" and {len(stray) - 3} more" if len(stray) > 3 else ""
    )
    return (f"ignored (not a regular file): {shown}",)


def _load_folder(path: Path, unknown_ok: bool) -> LoadedModel:
    entries = listing(path)
    names = {n for n, k in entries if k == "file"}
    has_st = any(n == INDEX_NAME for n, _ in entries) or any(n.endswith(".safetensors") for n in names)
    spec, config, why = _sibling_config(path, unknown_ok or has_st)
    weights = inventory_from_safetensors(path) if has_st else None
    if weights is None:
        ggufs = sorted(n for n in names if n.endswith(".gguf"))
        if len(ggufs) == 1:
            return _load_gguf(path / ggufs[0], _stray_notes(entries))
        if len(ggufs) > 1 and spec is None:
            raise GpumemInputError(
                f"holds {len(ggufs)} .gguf files and no config.json; open one .gguf file", source=str(path)
            )
    if spec is None and weights is None and config is None:
        named = next((s for s in (".gguf", ".safetensors", ".json") if path.name.lower().endswith(s)), None)
        what = f"is a folder, not a {named} file, and it holds" if named else "holds"
        stray = "".join(f" ({n})" for n in _stray_notes(entries))
        raise GpumemInputError(
            f"{what} nothing usable: no config.json, no .safetensors, no .gguf{stray}", source=str(path)
        )
    notes: tuple[str, ...] = ()
    if spec is None:
        notes = (
            (why or (_UNKNOWN_NOTE,))
            if config is not None
            else ("no config.json beside the weights: architecture unknown, weights only",)
        )
    return _loaded(str(path), "folder", spec, weights, notes + _stray_notes(entries), config)


def _load_gguf(path: Path, notes: tuple[str, ...] = ()) -> LoadedModel:
    # imported here: the gguf package (and numpy with it) costs start-up time and only GGUF files need it
    from gpumem_gui.core.readers.gguf import load_gguf_model

    weights, spec, config = load_gguf_model(path)
    if spec is None:
        notes = ("the GGUF architecture is not one gpumem describes: weights only", *notes)
    return _loaded(str(path), "gguf", spec, weights, notes, config)


def _load_safetensors(path: Path, unknown_ok: bool) -> LoadedModel:
    weights = inventory_from_safetensors(path)
    spec, config, why = _sibling_config(path.parent, True)
    notes: tuple[str, ...] = ()
    if spec is None:
        notes = (
            (why or (_UNKNOWN_NOTE,))
            if config
            else ("no config.json beside the file: architecture unknown, weights only",)
        )
    if len(weights.files) > 1:  # a shard given alone: read with the whole checkpoint
        notes = (f"{clip(path.name)} is one of {len(weights.files)} shards: read with all of them", *notes)
    return _loaded(str(path), "safetensors", spec, weights, notes, config)


def _load_path(path: Path, what: str, unknown_ok: bool) -> LoadedModel:
    if what == "folder":
        return _load_folder(path, unknown_ok)
    if what != "file":
        raise GpumemInputError(
            "is not a regular file (a FIFO, a device or a socket); give a model file or folder",
            source=str(path),
        )
    name = path.name.lower()
    if name.endswith(".safetensors.index.json"):
        return _load_folder(path.parent, unknown_ok)
    if name.endswith(".safetensors"):
        return _load_safetensors(path, unknown_ok)
    if name.endswith(".gguf"):
        return _load_gguf(path)
    if name.endswith(".json"):
        config = read_json_file(path)
        spec = _spec_of(lambda: load_config_file(path), unknown_ok)
        notes = () if spec else (_UNKNOWN_NOTE,)
        return _loaded(str(path), "config.json", spec, notes=notes, config=config)
    raise GpumemInputError(
        "unknown file type; expected config.json, .safetensors, model.safetensors.index.json or .gguf",
        source=str(path),
    )


def _load_hub(repo_id: str, client: HubClient, unknown_ok: bool) -> LoadedModel:
    cfg = client.fetch_config(repo_id)
    prov = Provenance(kind="hub", source=f"hf://{repo_id}")
    spec = _spec_of(
        lambda: spec_from_config(cfg, name=repo_id, source=f"{repo_id} (config.json)", provenance=prov),
        unknown_ok,
    )
    headers = client.fetch_safetensors_headers(repo_id)
    quant = cfg.get("quantization_config", {}) if isinstance(cfg, dict) else {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    weights = (
        inventory_from_safetensor_headers(headers, source=f"hf://{repo_id}", quant_method=method)
        if headers
        else None
    )
    notes = () if spec else (_UNKNOWN_NOTE,)
    return _loaded(repo_id, "hub", spec, weights, notes, config=cfg)


def load_model(
    source: str | Path, *, hub_client: HubClient | None = None, unknown_architecture_ok: bool = False
) -> LoadedModel:
    """Load ``source`` (see module docstring). Bad input raises :class:`GpumemInputError`.

    ``unknown_architecture_ok``: a config whose ``model_type`` the readers do not describe loads without a
    spec (its ``config`` kept), instead of being an error."""
    return _load(source, hub_client, unknown_architecture_ok)


def _load(source: str | Path, hub_client: HubClient | None, unknown_ok: bool) -> LoadedModel:
    text = str(source).strip()
    if not text:
        raise GpumemInputError("empty model name", field="model")
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~someone" whose home cannot be found: not a path, maybe an id
        path = Path(text)
    what = kind(path)
    if what != "missing":
        return _load_path(path, what, unknown_ok)
    entry = find_model(text)
    if entry is not None:
        return _loaded(entry.id, "catalog", entry.spec, config=catalog_config(entry))
    if looks_like_hub_id(text) and not text.endswith((".json", ".gguf", ".safetensors")):
        client = hub_client or (_default_hub_client() if _default_hub_client else None)
        if client is None:
            raise GpumemInputError("no Hugging Face Hub client is configured", source=text)
        return _load_hub(text, client, unknown_ok)
    raise GpumemInputError(
        "not a file or folder, not a catalog model (see `gpumem models`), and not a hub id (org/name)",
        source=text,
    )
