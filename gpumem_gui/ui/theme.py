"""Colors and small widget helpers shared by the panels.

The window follows the system palette. The only fixed colors are the chart series (one per component key, so
"weights" has the same color in every chart) and two status hues for "fits" and "misses"/errors, which are
picked light or dark to stay readable on the palette's window color.
"""

from __future__ import annotations

import zlib

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

# One color per component key (Okabe-Ito / Tableau-like hues that stay apart on light and dark backgrounds).
SERIES_COLORS: dict[str, str] = {
    "weights": "#4e79a7",
    "kv_cache": "#f28e2b",
    "act_hidden_states": "#76b7b2",
    "act_attention": "#e15759",
    "act_mlp": "#59a14f",
    "act_norm": "#edc948",
    "act_rope": "#b07aa1",
    "act_mask": "#ff9da7",
    "act_inputs": "#9c755f",
    "logits": "#d4a6c8",
    "generate_logits": "#a0cbe8",
    "activations": "#59a14f",
    "non_torch": "#8cd17d",
    "cudagraph": "#b6992d",
    "compute_buffer": "#86bcb6",
    "cuda_context": "#bab0ac",
    "workspace": "#d7b5a6",
    "nccl_buffers": "#ffbe7d",
    "allocator_reserve": "#79706e",
    # training (gpumem_gui.core.training component keys)
    "parameters": "#4e79a7",
    "gathered_parameters": "#a0cbe8",
    "buffers": "#9c755f",
    "gradients": "#f28e2b",
    "optimizer_states": "#b07aa1",
    "optimizer_temporaries": "#ff9da7",
    "weight_copies": "#76b7b2",
    "dequantized_weights": "#fabfd2",
    "temporaries": "#edc948",
    "inputs": "#499894",
    "pipeline_inflight": "#8cd17d",
    "context_parallel": "#d37295",
    "unsharded_gradients": "#86bcb6",  # apart from the FSDP all-gather buffers (no_sync accumulation)
    # what a GPU said (gpumem_gui.core observed parts, drawn beside an estimate: ui/diagnose_view.py); the
    # tensors take the weights' hue darkened, the cache the allocator reserve's, the rest apart from both
    "observed_tensors": "#2f4b7c",
    "observed_allocator_cache": "#5a524f",
    "observed_outside_pytorch": "#8cd17d",
    "observed_this_process": "#2f4b7c",
    "observed_outside_pytorch_or_others": "#b6992d",
    "observed_other_processes": "#d37295",
    "observed_every_process": "#499894",
    "observed_free": "#cfcfcf",
}
_FALLBACK = ("#499894", "#f1ce63", "#fabfd2", "#d37295", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d")

# Phase bars and sweep markers
PHASE_COLOR = "#4e79a7"
PEAK_COLOR = "#e15759"
FITS_COLOR = "#59a14f"
MISSES_COLOR = "#e15759"
CAPACITY_COLOR = "#e15759"
FREE_COLOR = "#f28e2b"
CURRENT_COLOR = "#76b7b2"
RESERVED_COLOR = "#9c755f"  # the caching allocator's reserved peak per phase (allocator model)


def series_color(key: str) -> str:
    """The chart color of component ``key`` (stable across runs for unknown keys too)."""
    if key in SERIES_COLORS:
        return SERIES_COLORS[key]
    return _FALLBACK[zlib.crc32(key.encode()) % len(_FALLBACK)]


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def status_color(palette: QPalette, ok: bool) -> QColor:
    """Green for "fits", red for "misses" and errors, light or dark to contrast with the window color."""
    if is_dark(palette):
        return QColor("#81c784" if ok else "#ff8a80")
    return QColor("#1b7a2e" if ok else "#c62828")


class ErrorLabel(QLabel):
    """A red, word-wrapped message shown next to a field; hidden (and taking no space) while empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self._apply_color()
        self.hide()

    def _apply_color(self) -> None:
        pal = self.palette()
        pal.setColor(QPalette.ColorRole.WindowText, status_color(self.palette(), ok=False))
        self.setPalette(pal)

    def show_message(self, text: str | None) -> None:
        if text:
            self.setText(text)
            self.show()
        else:
            self.clear()
            self.hide()

    def changeEvent(self, event) -> None:
        if event.type() == event.Type.ApplicationPaletteChange:
            self._apply_color()
        super().changeEvent(event)
