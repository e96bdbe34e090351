"""Run fields declared once: every field of a run model carries how it is typed, shown and spelled.

A run model (:class:`~gpumem_gui.core.runtimes.run.InferenceRun`, :class:`~gpumem_gui.core.training.run.
TrainingRun`) annotates each field with its validated range (pydantic) and a :class:`UI` entry: the CLI flag,
the form label and group, the unit, the help text, where the field applies. :func:`run_fields` reads both
into :class:`RunField` records, from which the CLI builds its flags, the window builds its forms, the
"copy command" writes a command line and ``make docs`` writes the README's flag table; nothing else lists
run fields.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

Kind = Literal["bool", "int", "float", "str", "choice", "list"]


@dataclass(frozen=True)
class UI:
    """How one run field is shown and spelled (the range and the default come from the model itself).

    ``flag`` defaults to ``--`` + the name with dashes; ``negate`` is the CLI flag of a boolean that defaults
    to true (``--no-flash-attn``); ``special`` names the lowest value of a number (``all layers`` for -1) or
    what an empty optional means (``auto``), ``none`` is the widget value standing for None; ``choices``
    label the values of a Literal in display order; ``engines`` are the inference engines the field applies
    to (empty: all); ``shown`` decides from the form's current values whether the field is offered;
    ``widget`` names a form widget the generic builder does not make (``weights``, ``kv_dtype``)."""

    label: str
    group: str
    help: str
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    negate: str | None = None
    unit: str = ""
    step: float = 1
    decimals: int = 2
    special: str | None = None
    none: float | None = None
    choices: tuple[tuple[str, Any], ...] = ()
    engines: tuple[str, ...] = ()
    shown: Callable[[Mapping[str, Any]], bool] | None = None
    widget: str = ""


@dataclass(frozen=True)
class RunField:
    """One field of a run model: its name, type kind, range, default and :class:`UI`."""

    name: str
    kind: Kind
    optional: bool
    default: Any
    lo: float | None
    hi: float | None
    values: tuple[Any, ...]  # a Literal's values
    ui: UI

    @property
    def flag(self) -> str:
        return self.ui.flag or "--" + self.name.replace("_", "-")

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the field is offered for a run with these current values."""
        if self.ui.engines and values.get("engine", self.ui.engines[0]) not in self.ui.engines:
            return False
        return self.ui.shown is None or bool(self.ui.shown(values))

    def text(self, value: Any) -> str:
        """The value as it is written on a command line."""
        if isinstance(value, tuple | list):
            return ",".join(str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    def parse(self, text: str) -> Any:
        """A command-line value as the model takes it (validation is the model's)."""
        if self.kind == "list":
            return text
        if self.kind == "choice" and self.values and isinstance(self.values[0], int):
            return int(text)
        if self.kind == "int":
            return int(text)
        if self.kind == "float":
            return float(text)
        return text


def _kind(annotation: Any) -> tuple[Kind, bool, tuple[Any, ...]]:
    args = get_args(annotation)
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            kind, _, values = _kind(non_none[0])
            return kind, True, values
        return "list", False, ()  # e.g. Literal["all-linear"] | tuple[str, ...]
    if origin is Literal:
        return "choice", False, args
    if get_origin(annotation) is not None and args:  # Annotated[...]
        return _kind(args[0])
    name = {bool: "bool", int: "int", float: "float", str: "str"}.get(annotation)
    if name is None:
        raise TypeError(f"run field of unsupported type {annotation!r}")
    return name, False, ()  # type: ignore[return-value]


def _bounds(metadata: list[Any]) -> tuple[float | None, float | None]:
    """The range pydantic's constraints give (``gt``/``lt`` bounds are reported as the bound itself)."""
    lo = hi = None
    for m in metadata:
        for attr in ("ge", "gt"):
            lo = getattr(m, attr, lo) if getattr(m, attr, None) is not None else lo
        for attr in ("le", "lt"):
            hi = getattr(m, attr, hi) if getattr(m, attr, None) is not None else hi
    return lo, hi


@cache
def run_fields(model: type[BaseModel]) -> tuple[RunField, ...]:
    """Every field of ``model`` that carries a :class:`UI`, in declaration order."""
    out = []
    for name, info in model.model_fields.items():
        meta = list(info.metadata)
        ui = next((m for m in meta if isinstance(m, UI)), None)
        if ui is None:
            continue
        kind, optional, values = _kind(info.annotation)
        lo, hi = _bounds(meta)
        out.append(RunField(name, kind, optional, info.default, lo, hi, values, ui))
    return tuple(out)
