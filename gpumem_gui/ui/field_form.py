"""Forms built from declarations: one builder for every run form.

:class:`FieldForm` is the shared plumbing (rows of label, widget and inline error label; one ``changed``
signal; errors shown next to the field they name). :class:`RunFieldsForm` builds a whole form from a run
model's field declarations (:func:`gpumem_gui.core.run_fields`): a group box per declared group, the widget
each field's kind calls for (spin boxes with the model's range and unit, check boxes, combo boxes with the
declared labels), tooltips from the help text, and visibility from where each field applies. A form adds
only what no declaration can say (the weights list, the KV dtypes an engine takes).

Contract of every form: ``value()`` builds a new validated model (raising :class:`GpumemInputError` that
names the field), ``checked_value()`` shows the problem inline instead, ``set_value(model)`` fills the
widgets under signal blockers (emitting nothing), and ``changed`` fires once per edit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from PySide6.QtCore import QSignalBlocker, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import GpumemInputError, RunField, run_fields
from gpumem_gui.ui.messages import one_line
from gpumem_gui.ui.theme import ErrorLabel


def combo_set(combo: QComboBox, data: object) -> bool:
    i = combo.findData(data)
    if i >= 0:
        combo.setCurrentIndex(i)
    return i >= 0


def blocked(widgets: Sequence[QWidget]) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for w in widgets:
        stack.enter_context(QSignalBlocker(w))
    return stack


def field_from_message(message: str, names: Sequence[str]) -> str | None:
    """A model-level validation error names no field; find the first field name its message mentions."""
    hits = [(message.find(n), n) for n in names if n in message]
    return min(hits)[1] if hits else None


def typed(widget: QWidget | None) -> bool:
    """Whether ``widget``'s value just changed because the user typed into its text field, as opposed to a
    step (arrow buttons or keys, the wheel), a pick from a list, a click or :meth:`setValue`: only typing
    leaves the text field marked modified (Qt clears the mark whenever it rewrites the text itself)."""
    edit: QLineEdit | None = None
    if isinstance(widget, QAbstractSpinBox):
        edit = widget.findChild(QLineEdit)
    elif isinstance(widget, QComboBox) and widget.isEditable():
        edit = widget.lineEdit()
    return edit is not None and edit.isModified()


def spin(lo: int, hi: int, step: int = 1, suffix: str = "", special: str | None = None) -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setSuffix(suffix)
    s.setGroupSeparatorShown(True)
    s.setKeyboardTracking(False)
    s.setAccelerated(True)
    if special:
        s.setSpecialValueText(special)
    return s


def combo(items: Sequence[tuple[str, object]]) -> QComboBox:
    c = QComboBox()
    for text, data in items:
        c.addItem(text, data)
    return c


@dataclass
class _Row:
    widget: QWidget
    error: ErrorLabel
    label: QLabel
    layout: QFormLayout


class FieldForm(QWidget):
    """Shared plumbing: rows of (label, widget, inline error label) and the error display."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: dict[str, _Row] = {}
        self.form_error = ErrorLabel()
        self.typing = False  # the last change was typed into a text field (the window waits for more keys)

    def _add_row(self, layout: QFormLayout, name: str, label: str, widget: QWidget, tip: str) -> QWidget:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(2)
        v.addWidget(widget)
        err = ErrorLabel()
        err.setObjectName(f"error_{name}")
        v.addWidget(err)
        lab = QLabel(label)
        lab.setBuddy(widget)
        lab.setToolTip(tip)
        widget.setToolTip(tip)
        widget.setObjectName(name)
        layout.addRow(lab, box)
        self._rows[name] = _Row(widget, err, lab, layout)
        return widget

    def _connect(self, widget: QWidget) -> None:
        if isinstance(widget, QSpinBox | QDoubleSpinBox):
            widget.valueChanged.connect(lambda *_, w=widget: self._emit_changed(w))
        elif isinstance(widget, QComboBox) and widget.isEditable():
            widget.currentTextChanged.connect(lambda *_, w=widget: self._emit_changed(w))
        elif isinstance(widget, QComboBox):
            widget.currentIndexChanged.connect(lambda *_, w=widget: self._emit_changed(w))
        elif isinstance(widget, QCheckBox):
            widget.toggled.connect(lambda *_, w=widget: self._emit_changed(w))

    def _emit_changed(self, widget: QWidget | None = None) -> None:
        """Emit ``changed``; :attr:`typing` says whether ``widget`` changed because its text was typed."""
        self.typing = typed(widget)
        self.changed.emit()

    def widget(self, name: str) -> QWidget:
        """The input widget of field ``name`` (tests and the window drive the form through these)."""
        return self._rows[name].widget

    def error_text(self, name: str | None = None) -> str:
        """The inline error shown for field ``name`` (or the form-level one), '' when none."""
        label = self.form_error if name is None else self._rows[name].error
        return "" if label.isHidden() else label.text()

    def show_error(self, field: str | None, message: str) -> None:
        """Show ``message`` next to ``field``'s widget, or above the form when no such field is here."""
        message = one_line(message)  # pydantic's "Value error, " is dropped by the core already
        row = self._rows.get(field or "")
        if row is not None:
            row.error.show_message(message)
        else:
            self.form_error.show_message(message)

    def clear_errors(self) -> None:
        self.form_error.show_message(None)
        for row in self._rows.values():
            row.error.show_message(None)

    def has_errors(self) -> bool:
        return not self.form_error.isHidden() or any(not r.error.isHidden() for r in self._rows.values())

    def _all_widgets(self) -> list[QWidget]:
        return [r.widget for r in self._rows.values()]


@dataclass
class Input:
    """A field's widget and how to read and write the model's value through it."""

    widget: QWidget
    get: Callable[[], Any]
    set: Callable[[Any], None]


def _float_spin(f: RunField) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    tick = 10.0**-f.ui.decimals
    lo = f.ui.none if f.optional and f.ui.none is not None else (f.lo or 0) + (tick if f.lo_open else 0)
    hi = (f.hi if f.hi is not None else 1e9) - (tick if f.hi_open else 0)
    s.setRange(lo, hi)
    s.setDecimals(f.ui.decimals)
    s.setSingleStep(f.ui.step)
    s.setSuffix(f.ui.unit)
    s.setKeyboardTracking(False)
    if f.optional and f.ui.special:
        s.setSpecialValueText(f.ui.special)
    return s


def default_input(f: RunField) -> Input:
    """The widget a field's kind calls for, with the model's range, unit, labels and None stand-in."""
    if f.kind == "bool":
        box = QCheckBox()
        return Input(box, box.isChecked, lambda v: box.setChecked(bool(v)))
    if f.kind == "int":
        none = int(f.ui.none) if f.optional and f.ui.none is not None else None
        lo = none if none is not None else int(f.lo if f.lo is not None else 0)
        hi = int(f.hi if f.hi is not None else 1 << 30)
        s = spin(lo, hi, int(f.ui.step), f.ui.unit, f.ui.special)
        if none is None:
            return Input(s, s.value, s.setValue)
        return Input(
            s,
            lambda: None if s.value() == none else s.value(),
            lambda v: s.setValue(none if v is None else v),
        )
    if f.kind == "float":
        d = _float_spin(f)
        none_f = f.ui.none if f.optional else None
        return Input(
            d,
            lambda: None if none_f is not None and d.value() < (f.lo or 0) else round(d.value(), 4),
            lambda v: d.setValue(none_f if v is None and none_f is not None else v),
        )
    items = f.ui.choices or tuple((str(v), v) for v in f.values)
    c = combo(items)
    if f.kind == "list":  # free text with suggestions (LoRA target modules)
        c.setEditable(True)

        def set_text(v: Any) -> None:
            text = v if isinstance(v, str) else ",".join(v)
            if not combo_set(c, text):
                c.setEditText(text)

        return Input(c, lambda: c.currentText().strip(), set_text)
    return Input(c, c.currentData, lambda v: combo_set(c, v))


def tooltip(f: RunField) -> str:
    text = f.ui.help[:1].upper() + f.ui.help[1:]
    return f"{text}.\n{f.flag}: {f.range_text()}; default {f.default_text()}."


class RunFieldsForm(FieldForm):
    """A form generated from ``model``'s run fields; ``make`` validates the values into a model.

    ``special`` makes the inputs of fields whose UI names a ``widget`` the builder does not know."""

    def __init__(
        self,
        model: type[BaseModel],
        make: Callable[..., BaseModel],
        special: dict[str, Callable[[RunField], Input]] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._model, self._make = model, make
        self._fields = run_fields(model)
        self._inputs: dict[str, Input] = {}
        self._spec: Any = None  # the loaded model's spec (None: none known, every field may apply)
        self.groups: dict[str, QGroupBox] = {}
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.form_error)
        layouts: dict[str, QFormLayout] = {}
        for f in self._fields:
            if f.ui.group not in self.groups:
                box = self.groups[f.ui.group] = QGroupBox(f.ui.group)
                layouts[f.ui.group] = QFormLayout(box)
                outer.addWidget(box)
            make_input = (special or {}).get(f.ui.widget, default_input) if f.ui.widget else default_input
            inp = self._inputs[f.name] = make_input(f)
            self._add_row(layouts[f.ui.group], f.name, f.ui.label, inp.widget, tooltip(f))
            self._connect(inp.widget)
        outer.addStretch(1)
        self.changed.connect(self._update_visibility)

    def layout_of(self, group: str) -> QFormLayout:
        layout = self.groups[group].layout()
        assert isinstance(layout, QFormLayout)
        return layout

    def raw_values(self) -> dict[str, Any]:
        """What the widgets hold now, unvalidated (visibility is decided from these)."""
        return {name: inp.get() for name, inp in self._inputs.items()}

    def set_model(self, spec: Any) -> None:
        """The model opened (its spec; None when unknown): the fields it cannot use (its declaration's
        ``UI.model``, e.g. images without a vision tower) are hidden and give their default to the run."""
        self._spec = spec
        self._update_visibility()

    def _run_values(self) -> dict[str, Any]:
        """:meth:`raw_values`, a field the model cannot use at its default (its widget keeps the user's value
        for the next model that can)."""
        values = self.raw_values()
        for f in self._fields:
            if not f.for_model(self._spec):
                values[f.name] = f.default
        return values

    def _update_visibility(self) -> None:
        values = self.raw_values()
        shown: dict[str, bool] = {}
        for f in self._fields:
            row = self._rows[f.name]
            visible = f.applies(values, self._spec)
            row.layout.setRowVisible(row.label, visible)
            shown[f.ui.group] = shown.get(f.ui.group, False) or visible
        for group, box in self.groups.items():
            box.setVisible(shown[group])

    def row_visible(self, name: str) -> bool:
        """Whether field ``name`` is offered now (its group and its row are shown)."""
        row = self._rows[name]
        group = row.label.parentWidget()
        return not row.label.isHidden() and (group is None or not group.isHidden())

    def value(self) -> Any:
        """The run the widgets describe. Raises :class:`GpumemInputError` (naming the field) when invalid."""
        try:
            return self._make(**self._run_values())
        except GpumemInputError as e:
            if e.field is None or e.field not in self._rows:
                e.field = field_from_message(e.message, list(self._rows)) or e.field
            raise

    def checked_value(self) -> Any:
        """:meth:`value`, with any problem shown inline instead of raised (errors cleared when valid)."""
        self.clear_errors()
        try:
            return self.value()
        except GpumemInputError as e:
            self.show_error(e.field, e.message)
            return None

    def _fill(self, run: BaseModel) -> None:
        for name, inp in self._inputs.items():
            inp.set(getattr(run, name))

    def set_value(self, run: BaseModel) -> None:
        """Fill every widget from ``run``; emits no ``changed``."""
        with blocked(self._all_widgets()):
            self._fill(run)
        self._update_visibility()
        self.clear_errors()
