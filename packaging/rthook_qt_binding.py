"""PyInstaller runtime hook of ``gpumem-gui``: PySide6 is the one Qt binding, before pyqtgraph looks.

pyqtgraph picks the first binding it finds already imported, then the ``PYQTGRAPH_QT_LIB`` variable, then
tries PyQt6, PySide6, PyQt5 and PySide2 in turn. Only PySide6 is bundled; importing it here (and naming it)
makes pyqtgraph use it without probing for the others.
"""

import os

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import PySide6  # noqa: F401
