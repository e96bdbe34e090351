"""Which files of a PyInstaller build of gpumem are kept: the Qt filter and the driver-library guard.

``keep_qt_file(path)`` takes a bundle-relative destination path as PyInstaller's TOC names it (for example
``PySide6/Qt/lib/libQt6Core.so.6`` or ``PySide6/Qt/plugins/platforms/libqxcb.so``) and says whether the
frozen app keeps it. It is pure (no file system, no PyInstaller) so that ``tests/test_packaging_filter.py``
can pin every decision down, and ``gpumem.spec`` applies it to ``a.binaries`` and ``a.datas``.

What gpumem needs from Qt: QtCore, QtGui, QtWidgets, QtSvg (icons, pyqtgraph's SVG export), QtOpenGL and
QtOpenGLWidgets (pyqtgraph imports them with ``importlib`` and dies without them, even when no GL is drawn),
QtDBus and QtXcbQpa (what Qt's xcb platform links), the ``xcb`` and ``offscreen`` platforms and a few small
plugins. Everything else (Qt Quick/QML, WebEngine, 3D, Multimedia, Network, SQL, printing, Wayland and
embedded platforms, translations, Designer, headers, type stubs) is dropped.

Never bundled, whatever links them: the NVIDIA driver's NVML library (``libnvidia-ml*``: NVML comes from the
user's driver at run time, and a missing driver is gpumem's ordinary "no NVIDIA driver" state), any CUDA
library, and QtWebEngine.

``keep_file(path)`` adds one more rule for the whole bundle: the C/C++ runtime libraries every Linux desktop
has (``libstdc++``, ``libgcc_s``, ``libexpat``) come from the system, as they do for a pip install of
gpumem. Bundling the build host's copies would raise the glibc the binary needs (Debian 12's libstdc++ wants
glibc 2.36) and can break the system's Mesa GL driver, which needs a libstdc++ at least as new as its own.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import TypeVar

# Qt modules (the ``X`` in ``libQt6X.so.6`` and ``PySide6/QtX.abi3.so``) the frozen app keeps.
KEEP_QT_MODULES = frozenset(
    {
        "Core",
        "Gui",
        "Widgets",
        "OpenGL",
        "OpenGLWidgets",
        "Svg",
        "DBus",  # linked by QtGui on Linux (accessibility, platform theme, input methods)
        "XcbQpa",  # the xcb platform plugin's own library
    }
)

# Qt plugins the frozen app keeps, by folder under ``PySide6/Qt/plugins`` and file-name stem.
KEEP_QT_PLUGINS: dict[str, frozenset[str]] = {
    "platforms": frozenset({"libqxcb", "libqoffscreen", "libqminimal"}),
    "xcbglintegrations": frozenset({"libqxcb-glx-integration", "libqxcb-egl-integration"}),
    "imageformats": frozenset({"libqpng", "libqsvg", "libqico", "libqjpeg"}),
    "iconengines": frozenset({"libqsvgicon"}),
    "platforminputcontexts": frozenset(
        {"libcomposeplatforminputcontextplugin", "libibusplatforminputcontextplugin"}
    ),
    "platformthemes": frozenset({"libqxdgdesktopportal"}),
}

# Folders of the PySide6 wheel that only serve development, QML or WebEngine.
DROP_PYSIDE_DIRS = frozenset(
    {
        "PySide6/Qt/translations",
        "PySide6/Qt/qml",
        "PySide6/Qt/libexec",
        "PySide6/Qt/resources",
        "PySide6/Qt/metatypes",
        "PySide6/Qt/mkspecs",
        "PySide6/Qt/modules",
        "PySide6/Qt/sbom",
        "PySide6/typesystems",
        "PySide6/include",
        "PySide6/glue",
        "PySide6/doc",
        "PySide6/examples",
    }
)

# File names that never go into the bundle: the driver's NVML, CUDA, and Qt WebEngine (matched without regard
# to case: QtWebEngineCore.abi3.so, libQt6WebEngineCore.so.6, qtwebengine_resources.pak, ...).
FORBIDDEN_PATTERNS = (
    "libnvidia-ml*",
    "libcuda*",
    "libcudart*",
    "libcublas*",
    "libcudnn*",
    "libcufft*",
    "libcurand*",
    "libcusparse*",
    "libcusolver*",
    "libnvrtc*",
    "libnvjitlink*",
    "libnccl*",
    "*webengine*",
)

# System libraries that stay out of the bundle (see the module docstring); the .deb depends on them.
SYSTEM_LIBRARY_PATTERNS = ("libstdc++.so*", "libgcc_s.so*", "libexpat.so*")

_QT_LIB = re.compile(r"^libQt6(?P<module>[A-Za-z0-9]+)\.so(\..*)?$")
_PYSIDE_MODULE = re.compile(r"^Qt(?P<module>[A-Za-z0-9]+)\.(abi3\.so|.*\.so|pyi|pyd)$")
_PYSIDE_EXTRA_LIB = re.compile(r"^libpyside6(?P<what>[a-z]*)\.abi3\.so(\..*)?$")


def _parts(path: str) -> tuple[str, ...]:
    return PurePosixPath(str(path).replace("\\", "/")).parts


def is_forbidden(path: str) -> bool:
    """True for a driver, CUDA or QtWebEngine file, wherever in the bundle it would land."""
    parts = _parts(path)
    return any(fnmatch.fnmatchcase(part.lower(), pattern) for part in parts for pattern in FORBIDDEN_PATTERNS)


def _pyside_relative(parts: tuple[str, ...]) -> tuple[str, ...] | None:
    """The parts from ``PySide6`` on, or None when the path is not inside the PySide6 package."""
    for i, part in enumerate(parts):
        if part == "PySide6":
            return parts[i:]
    return None


def keep_qt_file(path: str) -> bool:
    """Whether the frozen app keeps the file PyInstaller would put at ``path`` (bundle-relative).

    Files that have nothing to do with Qt are kept (False only for the forbidden driver/CUDA/WebEngine
    files); Qt files are kept only when gpumem needs them.
    """
    if is_forbidden(path):
        return False
    parts = _parts(path)
    if not parts:
        return True
    name = parts[-1]

    # A Qt library, wherever PyInstaller put it (inside PySide6/Qt/lib, or next to the executable).
    m = _QT_LIB.match(name)
    if m:
        return m.group("module") in KEEP_QT_MODULES

    rel = _pyside_relative(parts)
    if rel is None:
        return True
    joined = "/".join(rel)
    if any(joined == d or joined.startswith(d + "/") for d in DROP_PYSIDE_DIRS):
        return False

    # PySide6/Qt/plugins/<kind>/<plugin>.so
    if len(rel) >= 4 and rel[1] == "Qt" and rel[2] == "plugins":
        kind = rel[3]
        if len(rel) != 5:
            return False
        stem = name.split(".so")[0]
        return stem in KEEP_QT_PLUGINS.get(kind, frozenset())

    if len(rel) == 2:
        # PySide6/QtX.abi3.so and its type stub PySide6/QtX.pyi
        m = _PYSIDE_MODULE.match(name)
        if m:
            return name.endswith(".so") and m.group("module") in KEEP_QT_MODULES
        # libpyside6.abi3.so.6.x is needed; libpyside6qml (QML support) is not
        m = _PYSIDE_EXTRA_LIB.match(name)
        if m:
            return m.group("what") == ""
        if name.endswith(".pyi"):
            return False
        # Qt's own tools shipped in the wheel (designer, assistant, linguist, lupdate, qmlls, ...)
        if "." not in name:
            return False
    return True


def is_system_library(path: str) -> bool:
    """True for a C/C++ runtime library that the frozen app takes from the system (libstdc++, ...)."""
    name = _parts(path)[-1] if _parts(path) else ""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SYSTEM_LIBRARY_PATTERNS)


def keep_file(path: str) -> bool:
    """Whether the bundle keeps ``path``: the Qt filter, the driver guard and the system-library rule."""
    return keep_qt_file(path) and not is_system_library(path)


T = TypeVar("T", bound=tuple)


def filter_toc(toc: Iterable[T]) -> list[T]:
    """The entries of a PyInstaller TOC (``(dest_name, src_name, typecode)`` tuples) that are kept."""
    return [entry for entry in toc if keep_file(entry[0])]


def forbidden_in(paths: Iterable[str]) -> list[str]:
    """The paths among ``paths`` that must never be in the bundle."""
    return sorted(p for p in paths if is_forbidden(p))
