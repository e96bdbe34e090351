"""The model panel: a searchable catalog, Open… for local files, a Hugging Face id fetched in a worker thread,
and the chosen model's architecture and parameter breakdown.

Catalog ids and local files load synchronously (headers only, milliseconds); a hub id goes through
:class:`~gpumem_gui.ui.workers.BackgroundRunner`, so a slow or offline network never blocks the window, and a
failure shows its one-line reason under the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QFont, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    GpumemError,
    LoadedModel,
    SizeUnit,
    count_params,
    find_model,
    fmt_count,
    load_model,
    load_model_catalog,
)
from gpumem_gui.ui.messages import error_line, one_line
from gpumem_gui.ui.model_info import CountItem, architecture_html
from gpumem_gui.ui.theme import ErrorLabel
from gpumem_gui.ui.workers import BackgroundRunner

Loader = Callable[[str], LoadedModel]
COUNTS_DELAY_MS = 300
COUNTS_PER_TICK = 4


class ModelPanel(QWidget):
    """Pick, open or fetch a model; see what it is.

    Signals:
        model_loaded(object): a :class:`LoadedModel` is now the current model.
        load_failed(str): loading failed; the one-line reason (also shown in the panel).
        open_requested(): the user pressed "Open…" (the window owns the file dialog).
    """

    model_loaded = Signal(object)
    load_failed = Signal(str)
    open_requested = Signal()

    def __init__(self, loader: Loader = load_model, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._loader = loader
        self.unit = SizeUnit.GIB
        self.model: LoadedModel | None = None
        self._hub = BackgroundRunner("hub-loader", 1, self)
        self._hub.finished.connect(self._on_hub_finished)
        self._hub.failed.connect(self._on_hub_failed)
        self._pending: str | None = None
        top = self._build_search()
        self._build_catalog()
        hub_row = self._build_hub()
        self._build_details()

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addLayout(top)
        v.addLayout(hub_row)
        v.addWidget(self.status)
        v.addWidget(self.error)
        v.addWidget(self.title)
        v.addWidget(self.subtitle)
        v.addWidget(self.details, 1)

    def _build_search(self) -> QHBoxLayout:
        """The catalog filter and Open…"""
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Search the catalog: qwen3, llama 70b, moe…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._apply_filter)
        self.open_button = QPushButton("Open…")
        self.open_button.setToolTip(
            "Open a config.json, a model folder, a .safetensors or a .gguf file (Ctrl+O)"
        )
        self.open_button.clicked.connect(self.open_requested)
        top = QHBoxLayout()
        top.addWidget(self.filter, 1)
        top.addWidget(self.open_button)
        return top

    def _build_catalog(self) -> None:
        self.table = QTableWidget(0, 5)
        self.table.setHorizontalHeaderLabels(["model", "family", "size", "kind", "params"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.setAlternatingRowColors(True)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for i in (1, 2, 3, 4):
            h.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
        self._fill_catalog()
        self.table.itemSelectionChanged.connect(self._on_catalog_selection)

    def _build_hub(self) -> QHBoxLayout:
        """The Hugging Face id and Fetch, and the status and error lines under them."""
        self.hub = QLineEdit()
        self.hub.setPlaceholderText("Hugging Face id, e.g. Qwen/Qwen3-8B")
        self.hub.setToolTip("Fetches config.json and the safetensors headers (no weights); needs a network")
        self.hub.returnPressed.connect(self._on_fetch)
        self.fetch_button = QPushButton("Fetch")
        self.fetch_button.clicked.connect(self._on_fetch)
        hub_row = QHBoxLayout()
        hub_row.addWidget(self.hub, 1)
        hub_row.addWidget(self.fetch_button)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.error = ErrorLabel()
        self.error.setObjectName("model_error")
        return hub_row

    def _build_details(self) -> None:
        """The model's name and summary, and the tabs: catalog, architecture, parameters."""
        self.title = QLabel("No model yet")
        bold = QFont(self.title.font())
        bold.setBold(True)
        bold.setPointSizeF(bold.pointSizeF() * 1.15)
        self.title.setFont(bold)
        self.title.setWordWrap(True)
        self.subtitle = QLabel("")
        self.subtitle.setWordWrap(True)
        self.arch = QTextBrowser()
        self.params_table = QTableWidget(0, 3)
        self.params_table.setHorizontalHeaderLabels(["component", "parameters", "share"])
        self.params_table.verticalHeader().hide()
        self.params_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        ph = self.params_table.horizontalHeader()
        ph.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        ph.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        ph.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.details = QTabWidget()
        self.details.addTab(self.table, "Catalog")
        self.details.addTab(self.arch, "Architecture")
        self.details.addTab(self.params_table, "Parameters")

    # ---- catalog -------------------------------------------------------------------------------------------

    def _fill_catalog(self) -> None:
        models = load_model_catalog()
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(models))
        for r, m in enumerate(models):
            cells = [m.short_name, m.family, m.size_label, "MoE" if m.moe else "dense"]
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, m.id)
                item.setToolTip(m.id)
                self.table.setItem(r, c, item)
            item = CountItem(fmt_count(m.published_params))
            item.setData(Qt.ItemDataRole.UserRole, m.id)
            item.setToolTip("published figure; the exact count follows in a moment")
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(r, 4, item)
        self.table.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)  # catalog order
        self.table.setSortingEnabled(True)
        # exact counts take 0.1-0.4 s for the whole catalog: after the first paint, a few rows per idle tick
        # (the timer starts when the panel is first shown: counted from here, a slow start-up ran it first)
        self._pending_counts = [m.id for m in models]
        self._counts_timer = QTimer(
            self
        )  # a child: it dies with the panel, so it never fires into a dead one
        self._counts_timer.setSingleShot(True)
        self._counts_timer.timeout.connect(self._fill_exact_counts)
        self._counts_started = False

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._counts_started:
            self._counts_started = True
            self._counts_timer.start(COUNTS_DELAY_MS)

    def _fill_exact_counts(self) -> None:
        batch, self._pending_counts = (
            self._pending_counts[:COUNTS_PER_TICK],
            self._pending_counts[COUNTS_PER_TICK:],
        )
        rows = {self.table.item(r, 4).data(Qt.ItemDataRole.UserRole): r for r in range(self.table.rowCount())}
        sorting = self.table.isSortingEnabled()
        self.table.setSortingEnabled(False)
        for model_id in batch:
            entry = find_model(model_id)
            item = self.table.item(rows[model_id], 4) if model_id in rows else None
            if entry is None or item is None:
                continue
            total = count_params(entry.spec).total
            item.setText(fmt_count(total))
            item.setData(Qt.ItemDataRole.UserRole + 1, total)
            item.setToolTip(f"{total:,} parameters (exact)")
        self.table.setSortingEnabled(sorting)
        if self._pending_counts:
            self._counts_timer.start(0)

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for r in range(self.table.rowCount()):
            hay = " ".join(
                (
                    self.table.item(r, c).text()
                    + " "
                    + str(self.table.item(r, c).data(Qt.ItemDataRole.UserRole))
                )
                for c in range(self.table.columnCount())
            ).lower()
            self.table.setRowHidden(r, not all(w in hay for w in words))

    def visible_catalog_ids(self) -> list[str]:
        return [
            self.table.item(r, 0).data(Qt.ItemDataRole.UserRole)
            for r in range(self.table.rowCount())
            if not self.table.isRowHidden(r)
        ]

    def _on_catalog_selection(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return
        model_id = self.table.item(rows[0].row(), 0).data(Qt.ItemDataRole.UserRole)
        if self.model is not None and self.model.source == model_id:
            return
        self.load_source(model_id)

    def _select_catalog_row(self, model_id: str) -> None:
        self.table.blockSignals(True)
        try:
            self.table.clearSelection()
            for r in range(self.table.rowCount()):
                if self.table.item(r, 0).data(Qt.ItemDataRole.UserRole) == model_id:
                    self.table.selectRow(r)
                    self.table.scrollToItem(self.table.item(r, 0))
                    break
        finally:
            self.table.blockSignals(False)

    # ---- loading -------------------------------------------------------------------------------------------

    def is_local_or_catalog(self, source: str) -> bool:
        text = source.strip()
        return bool(text) and (Path(text).expanduser().exists() or find_model(text) is not None)

    def load_source(self, source: str) -> bool:
        """Load a catalog id or a local path now, or start fetching a hub id; False when it failed at once."""
        source = source.strip()
        if not source:
            return False
        if not self.is_local_or_catalog(source):
            self.fetch(source)
            return True
        try:
            loaded = self._loader(source)
        except GpumemError as e:
            self._fail(error_line(e))
            return False
        except OSError as e:
            self._fail(one_line(f"{source}: {e.strerror or e}"))
            return False
        except Exception as e:  # a reader bug: say so, keep the current model
            self._fail(one_line(f"{source}: could not be read ({error_line(e)})"))
            return False
        self.set_model(loaded)
        return True

    def try_load(self, source: str) -> LoadedModel:
        """Load a catalog id or local path without making it current (raises :class:`GpumemError`)."""
        return self._loader(source.strip())

    def fetch(self, hub_id: str) -> None:
        """Fetch a hub id in the background; the result arrives as ``model_loaded`` or ``load_failed``."""
        self._pending = hub_id
        self.error.show_message(None)
        self.status.setText(f"Fetching {hub_id} from the Hugging Face Hub…")
        self.fetch_button.setEnabled(False)
        loader = self._loader
        self._hub.submit(lambda: loader(hub_id))

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def wait_idle(self, timeout_ms: int = 5000) -> bool:
        return self._hub.wait(timeout_ms)

    def shutdown(self) -> None:
        self._hub.shutdown(2000)

    @Slot()
    def _on_fetch(self) -> None:
        text = self.hub.text().strip()
        if text:
            self.load_source(text)

    @Slot(int, object)
    def _on_hub_finished(self, job_id: int, result: object) -> None:
        if job_id != self._hub.latest:
            return
        self._pending = None
        self.fetch_button.setEnabled(True)
        self.status.setText("")
        assert isinstance(result, LoadedModel)
        self.set_model(result)

    @Slot(int, str)
    def _on_hub_failed(self, job_id: int, message: str) -> None:
        if job_id != self._hub.latest:
            return
        self._pending = None
        self.fetch_button.setEnabled(True)
        self.status.setText("")
        self._fail(message)

    def _fail(self, message: str) -> None:
        message = one_line(message)  # a hub error or a reader's text: one line in the panel
        self.error.show_message(message)
        self.load_failed.emit(message)

    # ---- display -------------------------------------------------------------------------------------------

    def set_model(self, m: LoadedModel) -> None:
        """Make ``m`` current: show it and emit ``model_loaded``."""
        self.model = m
        self.error.show_message(None)
        self._show(m)
        if m.source_kind == "catalog":
            self._select_catalog_row(m.source)
        else:
            self._select_catalog_row("")
        self.model_loaded.emit(m)

    def show_head(self, m: LoadedModel) -> None:
        """Show ``m``, the current model with another task head (its parameters counted again); emits
        nothing."""
        self.model = m
        self._show(m)

    def set_unit(self, unit: SizeUnit) -> None:
        self.unit = unit
        if self.model is not None:
            self._show(self.model)

    def _show(self, m: LoadedModel) -> None:
        self.title.setText(m.name)
        p = m.params
        bits = [m.source_kind]
        if p is not None:
            bits.append(f"{fmt_count(p.total)} parameters")
            if p.routed_experts:
                bits.append(f"{fmt_count(p.active_per_token)} active per token")
        if m.spec is not None and m.spec.approximate:
            bits.append("approximate: architecture not modelled")
        if m.spec is not None:
            bits.append(f"{m.spec.num_layers} layers, {m.spec.attention_kind}")
            bits.append(f"context {m.spec.max_position_embeddings:,}")
        else:
            bits.append("architecture unknown: estimates need a config.json")
        self.subtitle.setText(" · ".join(bits))
        self.arch.setHtml(architecture_html(m, self.unit))
        rows = [(k, v) for k, v in (p.by_component.items() if p else ()) if v]
        if p is not None:
            rows.append(("total", p.total))
            if p.routed_experts:
                rows.append(("active per token", p.active_per_token))
        self.params_table.setRowCount(len(rows))
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for r, (k, v) in enumerate(rows):
            share = f"{100 * v / max(1, p.total):.1f} %" if p else ""
            for c, text in enumerate((k.replace("_", " "), f"{v:,}", share)):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(right)
                self.params_table.setItem(r, c, item)
