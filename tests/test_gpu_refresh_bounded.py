"""A local GPU target whose free memory changes on every reading is re-estimated on every drawn reading; what
those re-estimates make must not pile up (issue 33 item 4; the soak is ``benchmarks/soak_flip.py --drift``).

The growth the README reported (~10 MiB an hour, outside Python's heap) was Qt's global ``QPixmapCache``: a
new banner ``QIcon`` per fits/misses flip (fixed in issue 18, ``tests/test_rough_ui.py`` covers the flips).
This checks the other half of the path, re-estimates whose verdict stays: once everything has been painted
once, 25 more readings put nothing new in the pixmap cache and leave the same number of Qt objects under the
window and of items in every chart's scene. (Checked to fail with a pixmap cached under a new key, or a
QObject made, per banner update.)
"""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtGui import QColor, QPixmap, QPixmapCache
from PySide6.QtWidgets import QApplication, QGraphicsView

from gpumem_gui.ui.main_window import MainWindow

H100_MIB = 81559  # resources/fake_gpus/8xh100_busy.json


def _drifting_h100s(gpus: int) -> dict:
    """H100s whose used memory differs on every reading (2 GiB and up, 7 MiB apart): a ~16.5 GiB plan fits."""
    used = [2048 + 7 * i for i in range(97)]
    return {
        "version": 1,
        "at_end": "cycle",
        "gpus": [
            {"name": "NVIDIA H100 80GB HBM3", "total_mib": H100_MIB, "used_mib": used[i:] + used[:i]}
            for i in range(gpus)
        ],
    }


def _census(w: MainWindow) -> tuple[int, tuple[int, ...]]:
    """Qt objects under the window, and items per chart scene."""
    scenes = tuple(len(v.scene().items()) for v in w.findChildren(QGraphicsView) if v.scene() is not None)
    return len(w.findChildren(QObject)), scenes


def test_re_estimates_for_new_free_memory_leave_nothing_behind(main_window: MainWindow, fake_snapshots):
    w = main_window
    snaps = fake_snapshots(_drifting_h100s(2), steps=45)
    limit = QPixmapCache.cacheLimit()
    QPixmapCache.clear()
    QPixmapCache.setCacheLimit(64)  # KiB: the probe (16 KiB) fits; a few new pixmaps evict it
    try:
        probe = QPixmap(64, 64)
        probe.fill(QColor("red"))
        states, frees, census = [], set(), []

        def show(readings: list) -> None:
            for snap in readings:
                w.on_snapshot(snap)
                w.recompute_now()  # what the refresh timer does a moment later
                QApplication.processEvents()  # paint it
                states.append(w.results.banner.state)
                frees.add(snap.devices[0].free_bytes)
            w.flush_background()
            census.append(_census(w))

        show(snaps[:15])  # the first paints of everything a re-estimate shows (the style caches them)
        census.clear()
        show(snaps[15:20])
        assert QPixmapCache.insert("gpumem-probe", probe)
        show(snaps[20:])
        assert set(states) == {"fits"} and len(frees) == 45  # re-estimated for new free memory, no flip
        assert QPixmapCache.find("gpumem-probe") is not None  # nothing new went into Qt's pixmap cache
        assert census[0] == census[1]
    finally:
        QPixmapCache.setCacheLimit(limit)
        QPixmapCache.clear()
