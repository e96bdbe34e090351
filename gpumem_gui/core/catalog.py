"""The built-in catalogs: popular open LLMs and the accelerators they run on.

Both live as JSON in the top-level ``resources/`` folder (``models.json``, ``gpus.json``). A wheel or a frozen
build ships that folder inside the package as ``gpumem_gui/resources`` (see ``pyproject.toml``);
:func:`resources_dir` finds either.

``models.json`` holds one entry per model: its Hugging Face id, the parameter count its publisher states (with
the source and the relative precision that figure implies) and the architecture as the compact JSON of a
:class:`~gpumem_gui.core.model.ModelSpec` (``model_dump(mode="json", exclude_defaults=True)`` without ``name``
and ``provenance``, which are filled in here from the id and the entry's ``source``). The file is generated
by ``resources/tools/build_model_catalog.py`` from the models' ``config.json`` files.

``gpus.json`` holds one entry per accelerator: memory in bytes (as the driver reports it where a sourced
figure exists, else the spec-sheet capacity; ``memory_kind`` says which), spec-sheet bandwidth and sources.

Every entry is validated when the catalog is first loaded; a broken resource raises a
:class:`GpumemInputError` that names the file and the entry.
"""

from __future__ import annotations

import difflib
import re
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.hf_config import read_json_file
from gpumem_gui.core.model import Frozen, ModelSpec, Provenance

MODEL_CATALOG_FILE = "models.json"
GPU_CATALOG_FILE = "gpus.json"
MODEL_CATALOG_FORMAT = "gpumem-model-catalog"
GPU_CATALOG_FORMAT = "gpumem-gpu-catalog"
CATALOG_VERSION = 1

NonEmpty = Annotated[str, Field(min_length=1, max_length=500)]
PositiveInt = Annotated[int, Field(gt=0)]


def resources_dir() -> Path:
    """The folder holding ``models.json`` and ``gpus.json``.

    Wheels and frozen builds put the top-level ``resources/`` inside the package (``gpumem_gui/resources``);
    editable and source installs use the ``resources/`` folder next to the package folder.
    """
    packaged = files("gpumem_gui") / "resources"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "resources"


# ---- models ------------------------------------------------------------------------------------------


class CatalogModel(Frozen):
    """One catalog model: its published size and its architecture."""

    id: str = Field(
        pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$", max_length=200, description="Hugging Face repo id"
    )
    family: NonEmpty = Field(description="e.g. 'Llama 3.1'")
    size_label: NonEmpty = Field(description="e.g. '8B', '30B-A3B'")
    moe: bool
    published_params: PositiveInt = Field(description="parameter count the model card or paper states")
    published_params_source: NonEmpty = Field(
        description="where that figure is stated (URL or paper + place)"
    )
    published_params_precision: float = Field(
        gt=0,
        le=0.5,
        description="relative tolerance the published figure implies (0.06 for a label like '7B')",
    )
    published_params_note: str = Field("", description="why the published figure and the exact count differ")
    source: NonEmpty = Field(description="where the architecture (config.json) comes from")
    source_verified: bool = Field(
        description="true: the config text was read from a real copy; false: written from memory of it"
    )
    verified_from: str = Field("", description="where the verified copy of the config text was read")
    spec: ModelSpec

    @model_validator(mode="after")
    def _check(self) -> CatalogModel:
        if self.moe != (self.spec.moe is not None):
            raise ValueError(f"moe is {self.moe} but the spec {'has' if self.spec.moe else 'has no'} experts")
        if self.source_verified and not self.verified_from:
            raise ValueError("source_verified entries must say where the copy was read (verified_from)")
        return self

    @property
    def short_name(self) -> str:
        """The id without its organisation, e.g. ``Llama-3.1-8B``."""
        return self.id.split("/", 1)[1]


# ---- GPUs --------------------------------------------------------------------------------------------


class GpuInfo(Frozen):
    """One accelerator: its usable memory, bandwidth and where those figures come from."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.\-]*$", max_length=60, description="short CLI name")
    aliases: tuple[str, ...] = ()
    name: NonEmpty = Field(description="marketing name")
    vendor: Literal["nvidia", "amd"]
    arch: NonEmpty
    compute_capability: str | None = Field(None, pattern=r"^\d+\.\d+$", description="NVIDIA only, e.g. '9.0'")
    memory_bytes: PositiveInt = Field(description="usable total memory in bytes")
    memory_kind: Literal["driver", "nominal"] = Field(
        description="driver: the total the driver reports (nvidia-smi, rocm-smi); nominal: the spec sheet"
    )
    memory_source: NonEmpty = Field(description="where memory_bytes comes from")
    memory_nominal: NonEmpty = Field(description="spec-sheet capacity, e.g. '80 GB HBM3'")
    bandwidth_bytes_per_s: PositiveInt | None = Field(None, description="spec-sheet memory bandwidth")
    source: NonEmpty = Field(description="spec sheet")
    note: str = Field("", description="what the entry stands for where that is not obvious")

    @model_validator(mode="after")
    def _check(self) -> GpuInfo:
        if self.vendor == "nvidia" and self.compute_capability is None:
            raise ValueError("NVIDIA entries need compute_capability")
        if self.vendor == "amd" and self.compute_capability is not None:
            raise ValueError("compute_capability is an NVIDIA notion; AMD entries leave it out")
        return self


# ---- loading -----------------------------------------------------------------------------------------


def _read_catalog(file_name: str, fmt: str, key: str) -> tuple[Path, list[Any]]:
    path = resources_dir() / file_name
    doc = read_json_file(path)
    if not isinstance(doc, dict):
        raise GpumemInputError("a catalog must hold a JSON object", source=str(path))
    if doc.get("format") != fmt:
        raise GpumemInputError(
            f"expected format '{fmt}', got {doc.get('format')!r}", source=str(path), field="format"
        )
    if doc.get("version") != CATALOG_VERSION:
        raise GpumemInputError(
            f"unsupported catalog version {doc.get('version')!r} (this gpumem reads {CATALOG_VERSION})",
            source=str(path),
            field="version",
        )
    entries = doc.get(key)
    if not isinstance(entries, list) or not entries:
        raise GpumemInputError("must be a non-empty list", source=str(path), field=key)
    return path, entries


def _entry_error(
    path: Path, key: str, index: int, raw: Any, problem: GpumemInputError | str
) -> GpumemInputError:
    ident = raw.get("id") if isinstance(raw, dict) else None
    where = f"{key}[{index}]" + (f" ({ident})" if isinstance(ident, str) else "")
    if isinstance(problem, GpumemInputError):
        detail = f"field '{problem.field}': {problem.message}" if problem.field else problem.message
    else:
        detail = problem
    return GpumemInputError(f"entry {where}: {detail}", source=str(path))


def _model_entry(raw: Any) -> CatalogModel:
    if not isinstance(raw, dict):
        raise GpumemInputError("must be a JSON object")
    spec_raw = raw.get("spec")
    if not isinstance(spec_raw, dict):
        raise GpumemInputError("must be a JSON object", field="spec")
    for reserved in ("name", "provenance"):
        if reserved in spec_raw:
            raise GpumemInputError(
                "is filled in from the entry; leave it out of the spec", field=f"spec.{reserved}"
            )
    try:
        spec = ModelSpec(
            **spec_raw,
            name=raw.get("id") or "?",
            provenance=Provenance(kind="catalog", source=str(raw.get("source", ""))),
        )
    except ValidationError as e:
        err = describe_validation_error(e)
        raise GpumemInputError(err.message, field=f"spec.{err.field}" if err.field else "spec") from None
    try:
        return CatalogModel(**{**raw, "spec": spec})
    except ValidationError as e:
        raise describe_validation_error(e) from None


@cache
def load_model_catalog() -> tuple[CatalogModel, ...]:
    """Every model of ``models.json``, validated (cached after the first call)."""
    path, entries = _read_catalog(MODEL_CATALOG_FILE, MODEL_CATALOG_FORMAT, "models")
    models: list[CatalogModel] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(entries):
        try:
            m = _model_entry(raw)
        except GpumemInputError as e:
            raise _entry_error(path, "models", i, raw, e) from None
        for key in (m.id.lower(), m.short_name.lower()):
            if key in seen:
                raise _entry_error(path, "models", i, raw, f"'{key}' is already used by {seen[key]}")
            seen[key] = m.id
        models.append(m)
    return tuple(models)


@cache
def load_gpu_catalog() -> tuple[GpuInfo, ...]:
    """Every accelerator of ``gpus.json``, validated (cached after the first call)."""
    path, entries = _read_catalog(GPU_CATALOG_FILE, GPU_CATALOG_FORMAT, "gpus")
    gpus: list[GpuInfo] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise _entry_error(path, "gpus", i, raw, "must be a JSON object")
        try:
            g = GpuInfo(**raw)
        except ValidationError as e:
            raise _entry_error(path, "gpus", i, raw, describe_validation_error(e)) from None
        for name in (g.id, *g.aliases):
            key = _gpu_key(name)
            if key in seen:
                raise _entry_error(path, "gpus", i, raw, f"name '{name}' is already used by {seen[key]}")
            seen[key] = g.id
        gpus.append(g)
    return tuple(gpus)


# ---- look-ups ----------------------------------------------------------------------------------------


def find_model(query: str) -> CatalogModel | None:
    """The catalog model whose id (``meta-llama/Llama-3.1-8B``) or id without the organisation
    (``Llama-3.1-8B``) equals ``query``, ignoring case; None when there is none."""
    q = query.strip().lower()
    if not q:
        return None
    for m in load_model_catalog():
        if q in (m.id.lower(), m.short_name.lower()):
            return m
    return None


def search_models(text: str) -> list[CatalogModel]:
    """Catalog models whose id, family or size label contain every word of ``text`` (case-insensitive);
    all models for an empty text."""
    words = text.lower().split()
    out = []
    for m in load_model_catalog():
        haystack = f"{m.id} {m.family} {m.size_label}".lower()
        if all(w in haystack for w in words):
            out.append(m)
    return out


def _gpu_key(name: str) -> str:
    """Case, spaces and underscores do not matter: 'h100 80gb' and 'H100_80GB' both mean 'H100-80GB'."""
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


def find_gpu(name: str) -> GpuInfo:
    """The catalog accelerator whose id or alias is ``name`` (case-insensitive).

    An unknown name raises :class:`GpumemInputError` listing the closest catalog names.
    """
    key = _gpu_key(name)
    names: dict[str, GpuInfo] = {}
    for g in load_gpu_catalog():
        for n in (g.id, *g.aliases):
            names[_gpu_key(n)] = g
    if key in names:
        return names[key]
    close = difflib.get_close_matches(key, list(names), n=5, cutoff=0.5)
    suggestions = list(dict.fromkeys(names[c].id for c in close))
    hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
    raise GpumemInputError(
        f"unknown GPU '{name}'{hint} (`gpumem gpus --catalog` lists the catalog)", field="gpu"
    )
