"""The installable binary's file filter (packaging/qt_filter.py) and the PyInstaller spec's hard rules.

The filter decides which Qt modules, plugins and translations the frozen app keeps; the spec must keep
QtOpenGL/QtOpenGLWidgets (pyqtgraph dies without them), collect exactly one Qt binding, use no UPX and no
strip, and never name the NVIDIA driver's NVML, a CUDA library or QtWebEngine. Building the binary itself is
``make package-test`` (too slow for the unit tests).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGING = REPO / "packaging"
SPEC = PACKAGING / "gpumem.spec"


def _load_filter() -> ModuleType:
    # "packaging" is also a PyPI package name: load the file directly instead of importing packaging.qt_filter
    spec = importlib.util.spec_from_file_location("gpumem_qt_filter", PACKAGING / "qt_filter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


qf = _load_filter()

KEPT = [
    # Qt libraries the app uses (inside the PySide6 folder and as PyInstaller's top-level links)
    "PySide6/Qt/lib/libQt6Core.so.6",
    "PySide6/Qt/lib/libQt6Gui.so.6",
    "PySide6/Qt/lib/libQt6Widgets.so.6",
    "PySide6/Qt/lib/libQt6OpenGL.so.6",
    "PySide6/Qt/lib/libQt6OpenGLWidgets.so.6",
    "PySide6/Qt/lib/libQt6Svg.so.6",
    "PySide6/Qt/lib/libQt6DBus.so.6",
    "PySide6/Qt/lib/libQt6XcbQpa.so.6",
    "libQt6Core.so.6",
    "libQt6OpenGLWidgets.so.6",
    "PySide6/Qt/lib/libicudata.so.73",
    # their Python bindings
    "PySide6/QtCore.abi3.so",
    "PySide6/QtGui.abi3.so",
    "PySide6/QtWidgets.abi3.so",
    "PySide6/QtOpenGL.abi3.so",
    "PySide6/QtOpenGLWidgets.abi3.so",
    "PySide6/QtSvg.abi3.so",
    "PySide6/libpyside6.abi3.so.6.11",
    "PySide6/__init__.py",
    "shiboken6/libshiboken6.abi3.so.6.11",
    # plugins
    "PySide6/Qt/plugins/platforms/libqxcb.so",
    "PySide6/Qt/plugins/platforms/libqoffscreen.so",
    "PySide6/Qt/plugins/xcbglintegrations/libqxcb-glx-integration.so",
    "PySide6/Qt/plugins/imageformats/libqsvg.so",
    "PySide6/Qt/plugins/imageformats/libqpng.so",
    "PySide6/Qt/plugins/iconengines/libqsvgicon.so",
    "PySide6/Qt/plugins/platforminputcontexts/libcomposeplatforminputcontextplugin.so",
    # everything that is not Qt
    "numpy.libs/libscipy_openblas64_-32a4b2a6.so",
    "numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
    "libpython3.11.so.1.0",
    "libxcb-cursor.so.0",
    "base_library.zip",
    "gpumem_gui/resources/models.json",
    "gpumem_gui/resources/fake_gpus/rtx4090_browser.json",
    "gpumem-0.1.0.dist-info/METADATA",
    "nvidia_ml_py-13.615.71.dist-info/METADATA",
    "pyqtgraph/colors/maps/CET-L1.csv",
]

DROPPED = [
    # WebEngine, in every form
    "PySide6/Qt/lib/libQt6WebEngineCore.so.6",
    "libQt6WebEngineCore.so.6",
    "PySide6/QtWebEngineWidgets.abi3.so",
    "PySide6/Qt/libexec/QtWebEngineProcess",
    "PySide6/Qt/resources/qtwebengine_resources.pak",
    "PySide6/Qt/translations/qtwebengine_locales/de.pak",
    "PySide6/Qt/plugins/designer/libqwebengineview.so",
    # 3D, Quick, QML
    "PySide6/Qt/lib/libQt63DCore.so.6",
    "PySide6/Qt3DRender.abi3.so",
    "PySide6/Qt/lib/libQt6Quick.so.6",
    "PySide6/Qt/lib/libQt6QuickWidgets.so.6",
    "PySide6/Qt/lib/libQt6Qml.so.6",
    "PySide6/QtQml.abi3.so",
    "PySide6/QtQuick.abi3.so",
    "PySide6/libpyside6qml.abi3.so.6.11",
    "PySide6/Qt/qml/QtQuick/Controls/libqtquickcontrols2plugin.so",
    "PySide6/Qt/plugins/qmltooling/libqmldbg_debugger.so",
    "PySide6/Qt/plugins/platforminputcontexts/libqtvirtualkeyboardplugin.so",
    # other unused modules
    "PySide6/Qt/lib/libQt6Network.so.6",
    "PySide6/QtNetwork.abi3.so",
    "PySide6/Qt/lib/libQt6Pdf.so.6",
    "PySide6/Qt/lib/libQt6Test.so.6",
    "PySide6/Qt/lib/libQt6Sql.so.6",
    "PySide6/Qt/lib/libQt6WaylandClient.so.6",
    "PySide6/Qt/lib/libQt6Multimedia.so.6",
    # translations
    "PySide6/Qt/translations/qt_de.qm",
    "PySide6/Qt/translations/qtbase_fr.qm",
    # plugins the app does not use
    "PySide6/Qt/plugins/platforms/libqwayland.so",
    "PySide6/Qt/plugins/platforms/libqeglfs.so",
    "PySide6/Qt/plugins/platforms/libqvnc.so",
    "PySide6/Qt/plugins/platforms/libqlinuxfb.so",
    "PySide6/Qt/plugins/platformthemes/libqgtk3.so",
    "PySide6/Qt/plugins/sqldrivers/libqsqlite.so",
    "PySide6/Qt/plugins/tls/libqopensslbackend.so",
    "PySide6/Qt/plugins/imageformats/libqpdf.so",
    "PySide6/Qt/plugins/imageformats/libqtiff.so",
    "PySide6/Qt/plugins/wayland-shell-integration/libxdg-shell.so",
    "PySide6/Qt/plugins/egldeviceintegrations/libqeglfs-kms-integration.so",
    "PySide6/Qt/plugins/generic/libqevdevmouseplugin.so",
    "PySide6/Qt/plugins/printsupport/libcupsprintersupport.so",
    # development files: type stubs, headers, tools
    "PySide6/QtCore.pyi",
    "PySide6/QtWebEngineCore.pyi",
    "PySide6/typesystems/typesystem_core.xml",
    "PySide6/include/QtCore/qobject.h",
    "PySide6/glue/qtcore.cpp",
    "PySide6/designer",
    "PySide6/Qt/metatypes/qt6core_relwithdebinfo_metatypes.json",
]

FORBIDDEN = [
    "libnvidia-ml.so.1",
    "libnvidia-ml.so.550.54.15",
    "nvidia/nvml/lib/libnvidia-ml.so.1",
    "libcuda.so.1",
    "libcudart.so.12",
    "nvidia/cublas/lib/libcublas.so.12",
    "nvidia/cudnn/lib/libcudnn.so.9",
    "libnccl.so.2",
    "PySide6/Qt/lib/libQt6WebEngineCore.so.6",
]


@pytest.mark.parametrize("path", KEPT)
def test_keeps_what_the_app_needs(path: str) -> None:
    assert qf.keep_qt_file(path), path
    assert qf.keep_file(path), path


@pytest.mark.parametrize("path", DROPPED)
def test_drops_unused_qt(path: str) -> None:
    assert not qf.keep_qt_file(path), path


@pytest.mark.parametrize("path", FORBIDDEN)
def test_never_bundles_driver_cuda_or_webengine(path: str) -> None:
    assert qf.is_forbidden(path)
    assert not qf.keep_qt_file(path)
    assert not qf.keep_file(path)
    assert qf.forbidden_in(["libpython3.11.so.1.0", path]) == [path]


def test_forbidden_is_about_files_not_the_python_nvml_binding() -> None:
    # pynvml (nvidia-ml-py) is pure Python and must be bundled; it loads the driver's library at run time
    for path in ("pynvml.py", "nvidia_ml_py-13.615.71.dist-info/METADATA", "gpumem_gui/hardware/nvml.py"):
        assert not qf.is_forbidden(path)
        assert qf.keep_file(path)


def test_system_runtime_libraries_come_from_the_system() -> None:
    for path in ("libstdc++.so.6", "libgcc_s.so.1", "libexpat.so.1"):
        assert qf.keep_qt_file(path)  # not a Qt decision
        assert qf.is_system_library(path)
        assert not qf.keep_file(path)
    assert not qf.is_system_library("numpy.libs/libgfortran-040039e1-0352e75f.so.5.0.0")


def test_windows_separators_and_toc_entries() -> None:
    assert not qf.keep_qt_file("PySide6\\Qt\\translations\\qt_de.qm")
    toc = [
        ("PySide6/Qt/lib/libQt6Core.so.6", "/src/libQt6Core.so.6", "BINARY"),
        ("PySide6/Qt/lib/libQt6Quick.so.6", "/src/libQt6Quick.so.6", "BINARY"),
        ("libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1", "BINARY"),
        ("libstdc++.so.6", "/usr/lib/libstdc++.so.6", "BINARY"),
        ("gpumem_gui/resources/gpus.json", "/repo/resources/gpus.json", "DATA"),
    ]
    assert [e[0] for e in qf.filter_toc(toc)] == [
        "PySide6/Qt/lib/libQt6Core.so.6",
        "gpumem_gui/resources/gpus.json",
    ]


def test_opengl_modules_are_kept() -> None:
    assert {"OpenGL", "OpenGLWidgets"} <= qf.KEEP_QT_MODULES


def test_on_the_installed_pyside6() -> None:
    """Applied to every file of the PySide6 wheel in this venv, only the wanted Qt modules are kept."""
    pyside = pytest.importorskip("PySide6")
    root = Path(pyside.__file__).parent
    site = root.parent
    kept = [p.relative_to(site).as_posix() for p in root.rglob("*") if p.is_file()]
    kept = [p for p in kept if qf.keep_qt_file(p)]
    modules = {
        name[len("libQt6") :].split(".so")[0]
        for name in (p.rsplit("/", 1)[-1] for p in kept)
        if name.startswith("libQt6")
    }
    assert modules <= qf.KEEP_QT_MODULES
    assert {"Core", "Gui", "Widgets", "OpenGL", "OpenGLWidgets"} <= modules
    bindings = {
        p.rsplit("/", 1)[-1].split(".")[0] for p in kept if p.count("/") == 1 and p.endswith(".abi3.so")
    }
    assert {"QtCore", "QtGui", "QtWidgets", "QtOpenGL", "QtOpenGLWidgets", "QtSvg"} <= bindings
    assert not any("WebEngine" in p or "/qml/" in p or p.endswith((".qm", ".pyi")) for p in kept)
    plugins = {p.split("/Qt/plugins/", 1)[1] for p in kept if "/Qt/plugins/" in p}
    assert {"platforms/libqxcb.so", "platforms/libqoffscreen.so", "imageformats/libqsvg.so"} <= plugins
    assert not any(
        p.startswith(("platforms/libqwayland", "platforms/libqeglfs", "wayland-")) for p in plugins
    )


# ---- the spec file ---------------------------------------------------------------------------------------


def _spec_tree() -> ast.Module:
    return ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))


def _calls(tree: ast.Module, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_spec_names_no_driver_libraries() -> None:
    """No string in the spec's code (comments aside) names NVML, CUDA or QtWebEngine to bundle."""
    names = [s for s in _strings(_spec_tree()) if not any(c.isspace() for c in s)]  # not the messages
    offenders = [s for s in names if qf.is_forbidden(s) or "nvidia-ml" in s or "libcuda" in s]
    assert not offenders, offenders
    for call in _calls(_spec_tree(), "Analysis"):
        for kw in call.keywords:
            if kw.arg in ("binaries", "datas", "hiddenimports"):
                assert not [s for s in _strings(kw.value) if "nvidia" in s.lower() or "cuda" in s.lower()]


def test_spec_hard_rules() -> None:
    tree = _spec_tree()
    exes, collects = _calls(tree, "EXE"), _calls(tree, "COLLECT")
    assert len(exes) == 2 and len(collects) == 1, "two executables in one folder"
    names = set()
    for call in [*exes, *collects]:
        kws = {kw.arg: kw.value for kw in call.keywords}
        assert isinstance(kws.get("upx"), ast.Constant) and kws["upx"].value is False, "no UPX"
        assert isinstance(kws.get("strip"), ast.Constant) and kws["strip"].value is False, "no strip"
        if call in exes:
            assert (
                isinstance(kws.get("exclude_binaries"), ast.Constant)
                and kws["exclude_binaries"].value is True
            )
            names.add(kws["name"].value)  # type: ignore[attr-defined]
    assert names == {"gpumem-gui", "gpumem"}
    strings = _strings(tree)
    assert "PySide6.QtOpenGL" in strings and "PySide6.QtOpenGLWidgets" in strings
    for other_binding in ("PyQt5", "PyQt6", "PySide2"):
        assert other_binding in strings, f"{other_binding} is not excluded"
    assert "rthook_qt_binding.py" in strings


def test_spec_helpers_exist() -> None:
    for name in (
        "entry_gui.py",
        "entry_cli.py",
        "rthook_qt_binding.py",
        "gpumem.desktop",
        "gpumem.svg",
        "gpumem.png",
    ):
        assert (PACKAGING / name).is_file(), name
    png = (PACKAGING / "gpumem.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 256 and int.from_bytes(png[20:24], "big") == 256


def test_runtime_hook_makes_pyqtgraph_use_pyside6() -> None:
    pytest.importorskip("pyqtgraph")
    code = (
        f"exec(compile(open({str(PACKAGING / 'rthook_qt_binding.py')!r}).read(), 'rthook', 'exec'))\n"
        "import sys, pyqtgraph.Qt as q\n"
        "others = [m for m in ('PyQt5', 'PyQt6', 'PySide2') if m in sys.modules]\n"
        "print(q.QT_LIB, others)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYQTGRAPH_QT_LIB"}
    env["QT_QPA_PLATFORM"] = "offscreen"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "PySide6 []"
