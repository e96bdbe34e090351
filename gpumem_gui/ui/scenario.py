"""Scenarios: a model, a run and a GPU target saved as versioned JSON; recent files; side-by-side comparison.

A scenario file::

    {"format": "gpumem-scenario", "version": 2,
     "model": {"source": "meta-llama/Llama-3.1-8B"},   # an encoder: "task": {"task", "num_labels"} too
     "mode": "infer",                      # or "train": which tab (and estimate) the scenario is about
     "run": {... every InferenceRun field ...},
     "training": {... every TrainingRun field ...},   # or null
     "gpu": {"kind": "catalog", "gpu_id": "RTX-4090", "count": 1, "margin_mib": 1024, "basis": "free", ...}}

Version 1 files (no ``mode``, no ``training``: inference only) are still read; they load as inference
scenarios. Files are always written as version 2.

Files are written atomically (a temporary file in the same folder, then ``os.replace``). Reading validates
the whole document first; anything wrong raises :class:`ScenarioError` with one clear line, and the caller
changes nothing.
"""

from __future__ import annotations

import html
import json
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    Estimate,
    InferenceRun,
    SizeUnit,
    TaskHead,
    TrainingRun,
    describe_validation_error,
    fmt_bytes,
)
from gpumem_gui.files import FileReadError, atomic_write, json_problem, open_regular, read_text
from gpumem_gui.ui.report import run_summary
from gpumem_gui.ui.target_form import GpuChoice

SCENARIO_FORMAT = "gpumem-scenario"
SCENARIO_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_RECENT = 8
# Largest scenario file read: a saved scenario is ~2 KB (every run field written out).
MAX_SCENARIO_BYTES = 1 << 20


class ScenarioError(Exception):
    """A scenario file that cannot be read or understood; ``str()`` is one line for the user."""


class ModelRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=1, max_length=4096, description="catalog id, local path or hub id")
    task: TaskHead | None = Field(None, description="an encoder's task head (None: the config's)")

    @model_serializer(mode="wrap")
    def _encoders_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A model that is no encoder is written as before: its source alone."""
        out = handler(self)
        if self.task is None:
            out.pop("task", None)
        return out


class Scenario(BaseModel):
    """One saved plan (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["gpumem-scenario"] = SCENARIO_FORMAT
    version: Literal[1, 2] = SCENARIO_VERSION
    model: ModelRef
    mode: Literal["infer", "train"] = "infer"
    run: InferenceRun = InferenceRun()
    training: TrainingRun | None = None
    gpu: GpuChoice = GpuChoice()

    @property
    def active_run(self) -> InferenceRun | TrainingRun:
        """The run the scenario is about: the training run in mode 'train', else the inference run."""
        return self.training if self.mode == "train" and self.training is not None else self.run

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


def scenario_from_json(text: str, source: str = "scenario") -> Scenario:
    """Parse and validate a scenario document; raises :class:`ScenarioError`."""
    doc, problem = json_problem(text)
    if problem is not None:
        raise ScenarioError(f"{source}: {problem}")
    if not isinstance(doc, dict):
        raise ScenarioError(f"{source}: a scenario must be a JSON object")
    if doc.get("format") != SCENARIO_FORMAT:
        raise ScenarioError(f"{source}: not a gpumem scenario (format is {reprlib.repr(doc.get('format'))})")
    version = doc.get("version")
    if version not in READABLE_VERSIONS:
        raise ScenarioError(
            f"{source}: scenario version {reprlib.repr(version)} is not supported (this gpumem reads "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    if version == 1:
        extra = sorted({"mode", "training"} & doc.keys())
        if extra:
            raise ScenarioError(f"{source}: a version 1 scenario has no {', '.join(extra)}")
        if "run" not in doc:
            raise ScenarioError(f"{source}: run: field required")
    try:
        sc = Scenario.model_validate(doc)
    except ValidationError as e:
        raise ScenarioError(describe_validation_error(e, source=source).one_line()) from None
    if sc.mode == "train" and sc.training is None:
        raise ScenarioError(f"{source}: mode 'train' needs a 'training' run")
    return sc.model_copy(update={"version": SCENARIO_VERSION})


def read_scenario(path: Path | str) -> Scenario:
    """Read a scenario file; raises :class:`ScenarioError` (never anything else for a bad file)."""
    try:
        text = read_text(path, MAX_SCENARIO_BYTES, "scenario")
    except FileReadError as e:
        raise ScenarioError(f"{path}: {e.problem}") from None
    return scenario_from_json(text, str(path))


def looks_like_scenario(path: Path | str) -> bool:
    """Whether ``path`` is a JSON file that says it is a gpumem scenario (cheap sniff, never raises, never
    blocks: a FIFO or device named ``.json`` is no scenario)."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        return False
    try:
        with open_regular(path, None, "scenario") as f:
            head = f.read(4096)
    except (FileReadError, OSError):
        return False
    return SCENARIO_FORMAT.encode() in head


def save_scenario(path: Path | str, scenario: Scenario) -> None:
    """Write ``scenario`` atomically (raises ``OSError`` when the folder cannot be written)."""
    atomic_write(Path(path), scenario.to_json())


class RecentFiles:
    """The recently opened or saved scenarios, newest first, kept in QSettings."""

    KEY = "recent/scenarios"

    def __init__(self, settings: QSettings, limit: int = MAX_RECENT) -> None:
        self._settings = settings
        self._limit = limit

    def paths(self) -> list[str]:
        value = self._settings.value(self.KEY, [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or []) if v][: self._limit]

    def add(self, path: Path | str) -> None:
        p = str(Path(path).resolve())
        items = [p, *(x for x in self.paths() if x != p)][: self._limit]
        self._settings.setValue(self.KEY, items)

    def remove(self, path: Path | str) -> None:
        p = str(path)
        self._settings.setValue(self.KEY, [x for x in self.paths() if x != p])

    def clear(self) -> None:
        self._settings.setValue(self.KEY, [])


# ---- comparison --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a name, what it runs, and its estimate."""

    title: str
    model: str
    run: InferenceRun | TrainingRun
    estimate: Estimate


def delta_rows(a: Estimate, b: Estimate) -> list[tuple[str, str, int, int]]:
    """``(key, label, bytes in a, bytes in b)`` for every component of either, in first-seen order; plus the
    total as the last row (key ``""``)."""
    labels: dict[str, str] = {}
    for c in (*a.components, *b.components):
        labels.setdefault(c.key, c.label)
    rows = []
    for key, label in labels.items():
        ca, cb = a.component(key), b.component(key)
        rows.append((key, label, ca.bytes if ca else 0, cb.bytes if cb else 0))
    rows.append(("", "total (what a fit checks)", a.total_bytes, b.total_bytes))
    return rows


class CompareDialog(QDialog):
    """Two scenarios side by side: what each runs, and each component's bytes with the difference."""

    def __init__(self, a: Side, b: Side, unit: SizeUnit, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare scenarios")
        self.resize(820, 520)
        head = QGridLayout()
        for col, side in enumerate((a, b)):
            title = QLabel(f"<b>{'AB'[col]}: {side.title}</b>")
            title.setWordWrap(True)
            text = QLabel(
                f"{html.escape(side.model)}<br>{html.escape(run_summary(side.run))}<br>"
                f"needs <b>{fmt_bytes(side.estimate.total_bytes, unit)}</b> per GPU"
            )
            text.setWordWrap(True)
            text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            head.addWidget(title, 0, col)
            head.addWidget(text, 1, col)
        rows = delta_rows(a.estimate, b.estimate)
        self.table = QTableWidget(len(rows), 4)
        self.table.setHorizontalHeaderLabels(
            ["component", f"A ({unit.value})", f"B ({unit.value})", f"B - A ({unit.value})"]
        )
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for i in (1, 2, 3):
            h.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
        bold = QFont(self.table.font())
        bold.setBold(True)
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for i, (key, label, na, nb) in enumerate(rows):
            d = nb - na
            cells = [
                label,
                f"{na / unit.factor:,.2f}",
                f"{nb / unit.factor:,.2f}",
                f"{d / unit.factor:+,.2f}",
            ]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"{key}: A {na:,} B, B {nb:,} B, difference {d:+,} B" if key else "")
                if col:
                    item.setTextAlignment(right)
                if not key:
                    item.setFont(bold)
                self.table.setItem(i, col, item)
        self.rows = rows
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        v = QVBoxLayout(self)
        v.addLayout(head)
        v.addWidget(self.table, 1)
        v.addWidget(buttons)


def side_titles(paths: Sequence[Path | str]) -> list[str]:
    return [Path(p).name for p in paths]
