"""The report's data tables, read from ``validation/data/*.json`` and checked on the way in.

A bad file is one :class:`DataFileError` line naming the file and the field: ``validation/data/x.json:
mappings[3] (tr-...).metrics[0].ours: ...``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpumem_gui.core.errors import GpumemError
from gpumem_gui.core.runtimes.inference import make_run
from gpumem_gui.core.training import make_training_run

from .common import DATA_DIR, REPO, GiB, MiB
from .ours import INFERENCE_FIELDS, OURS, TRAIN_OURS_KEYS, TRAINING_FIELDS, template_problem

T = TypeVar("T", bound=BaseModel)


class DataFileError(ValueError):
    """A data file that cannot be read or does not hold what the report needs."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _kind(key: str, info: ValidationInfo) -> str:
    """A metric's ``kind`` key, resolved to its wording in the file's ``kinds`` table."""
    kinds = (info.context or {}).get("kinds") or {}
    if key not in kinds:
        raise ValueError(f"unknown kind {key!r} (the file's kinds: {', '.join(kinds)})")
    return kinds[key]


def _template(text: str | None, fields: dict[str, Callable]) -> str | None:
    problem = None if text is None else template_problem(text, fields)
    if problem:
        raise ValueError(problem)
    return text


def _run(run: dict[str, Any], make: Callable[..., object]) -> dict[str, Any]:
    run = {k: tuple(v) if isinstance(v, list) else v for k, v in run.items()}
    try:
        make(**run)
    except GpumemError as e:
        raise ValueError(f"not a valid run: {e}") from None
    return run


# ---- published inference points (published_inference.json) ----------------------------------------------


class Metric(_Strict):
    """One published line and which of our numbers stands for it."""

    quote: str = Field(min_length=1)  # verbatim; its last number (and unit) is the measured value
    kind: str  # the wording of the file's kinds[key]
    ours: str  # a key of OURS
    reason: str | None = None  # a template, for rows off by more than REASON_THRESHOLD
    note: str = ""  # shown in the reason column whatever the error
    # the quote's unit where the line prints a bare number (transformers' docs print
    # bytes_to_giga_bytes(torch.cuda.max_memory_allocated()), i.e. bytes / 1024**3, without a unit)
    unit: Literal["GiB", "MiB"] | None = None

    _kind = field_validator("kind")(_kind)

    @field_validator("ours")
    @classmethod
    def _ours(cls, v: str) -> str:
        if v not in OURS:
            raise ValueError(f"unknown number {v!r} (known: {', '.join(OURS)})")
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        return _template(v, INFERENCE_FIELDS)


class Mapping(_Strict):
    id: str = Field(min_length=1)
    model: str  # catalog id, or "config:<name>" for a config in tests/reference
    twin: str  # "" when the published model itself is used; else why the spec stands for it
    run: dict[str, Any]
    capacity: str | float | None  # GPU catalog id, or GiB the log states; None: not a vLLM run
    metrics: tuple[Metric, ...] = Field(min_length=1)
    assumptions: str = ""

    @field_validator("run")
    @classmethod
    def _valid_run(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _run(v, make_run)


def _unique_ids(mappings: tuple[Mapping, ...] | tuple[TMapping, ...]) -> None:
    ids = [m.id for m in mappings]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"ids appear twice: {', '.join(dup)}")


class PublishedInference(_Strict):
    about: str = ""
    kinds: dict[str, str]
    mappings: tuple[Mapping, ...]

    @model_validator(mode="after")
    def _ids(self) -> PublishedInference:
        _unique_ids(self.mappings)
        return self


# ---- published training points (published_training.json) ------------------------------------------------

UNIT_FACTOR: dict[str, float] = {"GB": 1e9, "GiB": GiB, "MiB": MiB, "tokens": 1, "verdict": 1}


class TMetric(_Strict):
    label: str = Field(min_length=1)  # the published figure, as the point states it
    value: float  # in ``unit``
    unit: Literal["GB", "GiB", "MiB", "tokens", "verdict"]  # verdict: 1 fits, 0 OOM
    kind: str
    ours: str  # a key of the file's ours table
    reason: str | None = None

    _kind = field_validator("kind")(_kind)

    @field_validator("ours")
    @classmethod
    def _ours(cls, v: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("ours") or {}
        if v not in known:
            raise ValueError(f"unknown number {v!r} (the file's ours: {', '.join(known)})")
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        return _template(v, TRAINING_FIELDS)

    @model_validator(mode="after")
    def _unit_fits_ours(self) -> TMetric:
        want = {"fits": "verdict", "max_seq": "tokens"}.get(self.ours)
        if want and self.unit != want:
            raise ValueError(f"a {self.ours} figure is in unit {want!r}, not {self.unit!r}")
        if self.unit == "verdict" and self.value not in (0, 1):
            raise ValueError(f"a verdict is 1 (fits) or 0 (OOM), not {self.value}")
        return self

    @property
    def measured(self) -> float:
        """The figure in bytes (tokens for a largest sequence, 1/0 for a verdict)."""
        return self.value * UNIT_FACTOR[self.unit]


class TMapping(_Strict):
    id: str = Field(min_length=1)
    model: str  # catalog id, or "gpt2-large" (built from gpt2's config)
    twin: str
    run: dict[str, Any]
    metrics: tuple[TMetric, ...] = Field(min_length=1)
    assumptions: str
    gpu: str | None = None  # catalog GPU for max_seq / fits
    usable_gib: float | None = None  # fits: the usable memory the point states

    @field_validator("run")
    @classmethod
    def _valid_run(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _run(v, make_training_run)

    @model_validator(mode="after")
    def _bounds_have_a_gpu(self) -> TMapping:
        for mt in self.metrics:
            if mt.ours == "max_seq" and not self.gpu:
                raise ValueError("a max_seq figure needs the point's gpu")
            if mt.ours == "fits" and self.usable_gib is None:
                raise ValueError("a fits figure needs the point's usable_gib")
        return self


class PublishedTraining(_Strict):
    about: str = ""
    kinds: dict[str, str]
    ours: dict[str, str]  # what our number is, for each figure we stand for
    mappings: tuple[TMapping, ...]

    @field_validator("ours")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = set(v) - set(TRAIN_OURS_KEYS)
        if unknown:
            raise ValueError(
                f"no code for {', '.join(sorted(unknown))} (known: {', '.join(TRAIN_OURS_KEYS)})"
            )
        return v

    @model_validator(mode="after")
    def _ids(self) -> PublishedTraining:
        _unique_ids(self.mappings)
        return self


# ---- the small tables -------------------------------------------------------------------------------------


class NotReproduced(_Strict):
    about: str = ""
    points: dict[str, str]  # published id -> why we do not reproduce it


class InferencePick(_Strict):
    model: str
    batch: int
    seq: int
    attn: str


class TrainingPick(InferencePick):
    mode: str


class Subset(_Strict):
    inference: tuple[InferencePick, ...]
    training: tuple[TrainingPick, ...]
    published: tuple[str, ...]
    published_training: tuple[str, ...]


class Grid(_Strict):
    about: str = ""
    inference_modes: dict[str, str]  # the inference modes compared, and their label
    training_modes: dict[str, str]  # the training modes' labels
    subset: Subset


class LlmAnalysisTrain(_Strict):
    master_bytes: int
    other_op_bytes: int
    recompute: Literal[0, 1, 2]


class PeerSettings(_Strict):
    about: str = ""
    llm_analysis_train: dict[str, LlmAnalysisTrain]


# ---- loading ----------------------------------------------------------------------------------------------


def _where(loc: tuple[int | str, ...], raw: object) -> str:
    """``mappings[3] (tr-x).metrics[0].ours`` for a pydantic location (an entry named by its id)."""
    out, node = "", raw
    for part in loc:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            out += f"[{part}]" + (f" ({node['id']})" if isinstance(node, dict) and "id" in node else "")
        else:
            node = node.get(part) if isinstance(node, dict) else None
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def load(name: str, model: type[T]) -> T:
    """``validation/data/<name>`` as ``model``; a :class:`DataFileError` naming the file and field."""
    path = DATA_DIR / name
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataFileError(f"{where}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise DataFileError(f"{where}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return model.model_validate(raw, context=raw if isinstance(raw, dict) else None)
    except ValidationError as e:
        errors = e.errors()
        # an entry that failed also leaves its list too short: report the entry, not the list
        errors = [
            x for x in errors if not any(y["loc"][: len(x["loc"])] == x["loc"] != y["loc"] for y in errors)
        ]
        err = errors[0]
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise DataFileError(f"{where}: {_where(err['loc'], raw)}: {msg}{more}") from None


@cache
def published_inference() -> PublishedInference:
    return load("published_inference.json", PublishedInference)


@cache
def published_training() -> PublishedTraining:
    return load("published_training.json", PublishedTraining)


@cache
def not_reproduced() -> dict[str, str]:
    return load("not_reproduced.json", NotReproduced).points


@cache
def grid() -> Grid:
    return load("grid.json", Grid)


@cache
def peer_settings() -> PeerSettings:
    return load("peer_settings.json", PeerSettings)
