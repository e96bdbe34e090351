"""The Qt window: forms read into core models, core results drawn. No estimation logic lives here.

Importing this package imports PySide6 first, so pyqtgraph (imported by modules below) binds to it whatever
the import order elsewhere. QtOpenGL and QtOpenGLWidgets are pyqtgraph's hidden imports; naming them here also
helps freezers (PyInstaller, Nuitka) find them.
"""

import PySide6.QtCore
import PySide6.QtOpenGL
import PySide6.QtOpenGLWidgets
import PySide6.QtWidgets  # noqa: F401
