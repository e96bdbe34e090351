"""Where the cluster's GPUs are read from: the connection dialog and the settings it keeps.

The dialog asks for a Prometheus server's URL, a selector, the host label, and optional paths to a bearer
token file, a basic-auth file (``user:password``) and a CA file. Only those paths are stored, never a
credential (the environment variables ``GPUMEM_PROMETHEUS_TOKEN``, ``_USER`` and ``_PASSWORD`` work too). OK
builds the backend at once: a bad field stays in the dialog as one red line, naming the field.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import GpumemInputError
from gpumem_gui.hardware import PrometheusBackend, make_prometheus_config
from gpumem_gui.hardware.prometheus_config import PASSWORD_ENV, TOKEN_ENV, USER_ENV
from gpumem_gui.ui.theme import ErrorLabel

SOURCE_KEY = "gpus/source"  # 'local' or 'cluster'
FIELDS = ("url", "selector", "host_label", "token_file", "basic_auth_file", "ca_file")
FILE_FIELDS = ("token_file", "basic_auth_file", "ca_file")
LABELS = {
    "url": "Prometheus URL",
    "selector": "Selector",
    "host_label": "Host label",
    "token_file": "Bearer token file",
    "basic_auth_file": "Basic-auth file",
    "ca_file": "CA file",
}
PLACEHOLDERS = {
    "url": "http://prometheus.example:9090",
    "selector": '{cluster="a"} (optional)',
    "host_label": "Hostname",
    "token_file": "(optional) a file holding the token",
    "basic_auth_file": "(optional) a file holding user:password",
    "ca_file": "(optional) PEM file of the server's CA",
}


def saved_connection(settings: QSettings) -> dict[str, str]:
    """The saved connection fields (empty strings where none was saved)."""
    return {f: str(settings.value(f"cluster/{f}", "") or "") for f in FIELDS}


def save_connection(settings: QSettings, values: dict[str, str]) -> None:
    for f in FIELDS:
        settings.setValue(f"cluster/{f}", values.get(f, ""))


def saved_source(settings: QSettings) -> str:
    return "cluster" if settings.value(SOURCE_KEY, "local") == "cluster" else "local"


def save_source(settings: QSettings, source: str) -> None:
    settings.setValue(SOURCE_KEY, source)


def make_backend(values: dict[str, str]) -> PrometheusBackend:
    """The backend for these fields; a bad one raises GpumemInputError (one line, naming the field)."""
    fields: dict[str, object] = {"url": values.get("url", "").strip()}
    fields["selector"] = values.get("selector", "").strip()
    fields["host_label"] = values.get("host_label", "").strip() or "Hostname"
    for f in FILE_FIELDS:
        path = values.get(f, "").strip()
        fields[f] = path or None
    if not fields["url"]:
        raise GpumemInputError("give the Prometheus server's URL, e.g. http://prometheus:9090", field="url")
    return PrometheusBackend(make_prometheus_config(**fields))


class ClusterDialog(QDialog):
    """The connection form (see module docstring); after OK, :attr:`backend` and :meth:`values` hold it."""

    def __init__(
        self, values: dict[str, str], error: str | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Cluster GPUs (Prometheus)")
        self.setObjectName("cluster_dialog")
        self.backend: PrometheusBackend | None = None
        self.edits: dict[str, QLineEdit] = {}
        form = QFormLayout()
        for f in FIELDS:
            edit = QLineEdit(values.get(f, ""))
            edit.setPlaceholderText(PLACEHOLDERS[f])
            edit.setObjectName(f"cluster_{f}")
            self.edits[f] = edit
            form.addRow(LABELS[f], self._with_browse(f, edit) if f in FILE_FIELDS else edit)
        note = QLabel(
            "A server that scrapes NVIDIA's dcgm-exporter. Only file paths are kept; credentials are read "
            f"from the files when connecting, or from ${TOKEN_ENV}, or ${USER_ENV} and ${PASSWORD_ENV}."
        )
        note.setWordWrap(True)
        note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error = ErrorLabel()
        self.error.show_message(error)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Connect")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        v = QVBoxLayout(self)
        v.addLayout(form)
        v.addWidget(note)
        v.addWidget(self.error)
        v.addWidget(buttons)
        self.resize(560, self.sizeHint().height())

    def _with_browse(self, f: str, edit: QLineEdit) -> QWidget:
        box = QWidget()
        h = QHBoxLayout(box)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(edit, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda _c=False: self._browse(f))
        h.addWidget(browse)
        return box

    def _browse(self, f: str) -> None:
        path, _ = QFileDialog.getOpenFileName(self, LABELS[f], self.edits[f].text())
        if path:
            self.edits[f].setText(path)

    def values(self) -> dict[str, str]:
        return {f: e.text().strip() for f, e in self.edits.items()}

    def accept(self) -> None:
        """Build the backend; a bad field is shown in the dialog, which stays open."""
        try:
            self.backend = make_backend(self.values())
        except GpumemInputError as e:
            self.error.show_message(e.one_line())
            edit = self.edits.get((e.field or "").split(".")[0])
            if edit is not None:
                edit.setFocus()
            return
        self.error.show_message(None)
        super().accept()
