"""The Qt window: forms read into core models, core results drawn. No estimation logic lives here.

Importing this package imports PySide6 first, so pyqtgraph (imported by the charts, after the window's first
paint: :mod:`gpumem_gui.ui.chart_slots`) binds to it whatever the import order elsewhere. QtOpenGL and
QtOpenGLWidgets, pyqtgraph's hidden imports, are named in :mod:`gpumem_gui.ui.chart_base` just before it
(freezers such as PyInstaller and Nuitka find them there).
"""

import PySide6.QtCore
import PySide6.QtWidgets  # noqa: F401
