"""Smoke test of the built artifacts (``make package-test``): does the archive a user downloads work?

Unpacks ``dist/gpumem-<version>-linux-x86_64.tar.gz`` into a new empty folder and runs its programs there
with a bare environment (PATH=/usr/bin:/bin, a throwaway HOME, no venv, no PYTHONPATH):

* ``gpumem --version`` / ``gpumem-gui --version`` print the pyproject version;
* ``gpumem inspect``, ``estimate``, ``models``, ``gpus --catalog`` and ``gpus --fake-gpus`` print the same
  JSON as the source install (``.venv/bin/gpumem``), which also shows that the catalogs and the fake-GPU
  scenarios are found inside the frozen app;
* ``gpumem-gui --self-test --fake-gpus rtx4090_browser`` exits 0 offscreen within a timeout (and on a real
  X server too when ``xvfb-run`` is installed);
* no ``libnvidia-ml*``, ``libcuda*`` or ``QtWebEngine*`` file is in the bundle; every Qt library and plugin
  it keeps finds its shared libraries;
* ``install.sh`` / ``uninstall.sh`` work into a scratch prefix; the ``.deb`` has the right control fields
  and its programs run;
* reports the unpacked size, the archive sizes, the 15 largest files and what takes the room.

Prints one line per check and ends with ``smoke: N passed, N failed``; exits 1 if any check failed.

The checks themselves are in ``smoke_checks.py``; this script unpacks, runs them in order and reports.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from smoke_checks import (  # noqa: E402
    CEILING_ARCHIVE_MIB,
    CEILING_UNPACKED_MIB,
    CLI_TIMEOUT_S,
    DEB_DEPENDS,
    GOAL_ARCHIVE_MIB,
    GOAL_UNPACKED_MIB,
    JSON_COMMANDS,
    SELF_TEST_TIMEOUT_S,
    VOLATILE_KEYS,
    Bundle,
    MiB,
    cluster_client,
    contents,
    deb,
    drop_volatile,
    install_uninstall,
    is_elf,
    json_differences,
    libraries_resolve,
    no_forbidden,
    nvml_binding,
    regular_files,
    run,
    same_json,
    self_test,
    sizes,
    trace_with_a_python,
    unpack,
    versions,
)
from smoke_hub import hub_client, hub_offline  # noqa: E402

__all__ = [
    "CEILING_ARCHIVE_MIB",
    "CEILING_UNPACKED_MIB",
    "CLI_TIMEOUT_S",
    "DEB_DEPENDS",
    "GOAL_ARCHIVE_MIB",
    "GOAL_UNPACKED_MIB",
    "JSON_COMMANDS",
    "SELF_TEST_TIMEOUT_S",
    "VOLATILE_KEYS",
    "Checks",
    "MiB",
    "bare_env",
    "component",
    "drop_volatile",
    "is_elf",
    "json_differences",
    "main",
    "project_version",
    "regular_files",
    "run",
    "size_report",
]


def project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> Any:
        t0 = time.perf_counter()
        try:
            detail = fn()
        except Exception as e:  # a failed check is reported, and the others still run
            self.failed.append(name)
            print(f"FAIL  {name} ({time.perf_counter() - t0:.1f} s): {e}", flush=True)
            return None
        self.passed += 1
        print(f"ok    {name} ({time.perf_counter() - t0:.1f} s){': ' + detail if detail else ''}", flush=True)
        return detail


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    """No venv, no PYTHONPATH: what a user's shell after unpacking the archive looks like."""
    runtime = home / "runtime"
    runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "XDG_RUNTIME_DIR": str(runtime),
        "QT_QPA_PLATFORM": "offscreen",
    }
    env.update(extra)
    return env


def size_report(bundle: Path, archives: list[Path]) -> tuple[int, list[str]]:
    files = regular_files(bundle)
    total = sum(p.stat().st_size for p in files)
    lines = [f"unpacked: {total / MiB:.1f} MiB in {len(files)} files (goal < {GOAL_UNPACKED_MIB} MiB)"]
    for a in archives:
        if a.is_file():
            lines.append(f"{a.name}: {a.stat().st_size / MiB:.1f} MiB")
    lines.append("15 largest files:")
    for p in sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:15]:
        lines.append(f"  {p.stat().st_size / MiB:6.1f} MiB  {p.relative_to(bundle)}")
    groups: dict[str, int] = {}
    for p in files:
        groups[component(p.relative_to(bundle).as_posix())] = (
            groups.get(component(p.relative_to(bundle).as_posix()), 0) + p.stat().st_size
        )
    lines.append("by component:")
    for name, size in sorted(groups.items(), key=lambda kv: kv[1], reverse=True):
        lines.append(f"  {size / MiB:6.1f} MiB  {name}")
    return total, lines


def component(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    if "/PySide6/Qt/lib/libicu" in "/" + rel:
        return "ICU (Unicode data, needed by QtCore)"
    if "/PySide6/Qt/lib/" in "/" + rel or name.startswith("libQt6"):
        return "Qt libraries"
    if "/PySide6/Qt/plugins/" in "/" + rel:
        return "Qt plugins"
    if "/PySide6/" in "/" + rel or "/shiboken6/" in "/" + rel:
        return "PySide6/shiboken6 bindings"
    if "/numpy.libs/" in "/" + rel:
        return "numpy's OpenBLAS + gfortran"
    if "/numpy/" in "/" + rel:
        return "numpy"
    if name in ("gpumem", "gpumem-gui"):
        return "the two executables (bootloader + Python modules, compressed)"
    if name.startswith("libpython") or "/lib-dynload/" in rel or name == "base_library.zip":
        return "Python runtime"
    if "/pydantic" in "/" + rel:
        return "pydantic"
    if "/pyqtgraph/" in "/" + rel:
        return "pyqtgraph data"
    if "/gpumem_gui/resources/" in "/" + rel:
        return "gpumem resources"
    if rel.startswith("_internal/lib") and "/" not in rel[len("_internal/") :]:
        return "system libraries (X11/xcb, fontconfig, glib, dbus, ...)"
    return "other"


def parse_args(argv: list[str] | None, version: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, default=REPO / "dist" / f"gpumem-{version}-linux-x86_64.tar.gz")
    ap.add_argument("--deb", type=Path, default=REPO / "dist" / f"gpumem_{version}_amd64.deb")
    ap.add_argument("--source-gpumem", type=Path, default=REPO / ".venv" / "bin" / "gpumem")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    version = project_version()
    args = parse_args(argv, version)

    if not args.archive.is_file():
        print(f"smoke_test: {args.archive} does not exist; run `make package` first", file=sys.stderr)
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="gpumem-smoke-"))
    unpack_dir = scratch / "unpacked"
    unpack_dir.mkdir()
    home = scratch / "home"
    env = bare_env(home)
    checks = Checks()
    print(f"smoke test of {args.archive} (gpumem {version}) in {scratch}", flush=True)

    found: dict[str, Path] = {}
    checks.run("unpack into an empty folder", partial(unpack, args.archive, unpack_dir, found))
    bundle = found.get("b")
    if bundle is None:
        print(f"smoke: {checks.passed} passed, {len(checks.failed)} failed")
        return 1
    b = Bundle(root=bundle, scratch=scratch, env=env, version=version, source_gpumem=args.source_gpumem)
    run_bundle_checks(checks, b, args.deb)

    total, lines = size_report(bundle, [args.archive, args.deb])
    print("\n".join(lines), flush=True)
    checks.run(
        f"sizes under the regression ceilings ({CEILING_UNPACKED_MIB}/{CEILING_ARCHIVE_MIB} MiB)",
        partial(sizes, args.archive, total),
    )

    if args.keep:
        print(f"kept {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"smoke: {checks.passed} passed, {len(checks.failed)} failed", flush=True)
    return 1 if checks.failed else 0


def run_bundle_checks(checks: Checks, b: Bundle, deb_path: Path) -> None:
    """Every check of the unpacked bundle and the .deb, in order (the sizes come after the size report)."""
    checks.run("--version (the pyproject version)", partial(versions, b))
    for command in JSON_COMMANDS:
        checks.run("gpumem " + " ".join(command) + " == source install", partial(same_json, b, command))
    checks.run("gpumem gpus --json: NVML binding bundled, driver from the system", partial(nvml_binding, b))
    checks.run("gpumem gpus --prometheus: the cluster's HTTP client bundled", partial(cluster_client, b))
    checks.run("gpumem inspect <hub id> offline: one line saying so", partial(hub_offline, b))
    checks.run(
        "gpumem inspect <hub id>: huggingface_hub bundled (local Hub stand-in)", partial(hub_client, b)
    )
    if importlib.util.find_spec("torch") is not None:
        checks.run(
            "gpumem trace --python (the worker in another Python)",
            partial(trace_with_a_python, b, sys.executable),
        )
    else:
        print("skip  gpumem trace: this Python has no torch (make install-trace)")
    checks.run(
        "gpumem-gui --self-test --fake-gpus rtx4090_browser (offscreen)", partial(self_test, b, b.env, [])
    )
    xvfb_run = shutil.which("xvfb-run")
    if xvfb_run:
        xcb_env = {**b.env, "QT_QPA_PLATFORM": "xcb"}
        checks.run(
            "gpumem-gui --self-test on a real X server (xvfb-run, xcb)",
            partial(self_test, b, xcb_env, [xvfb_run, "-a", "-s", "-screen 0 1280x800x24"]),
        )
    else:
        print("skip  self-test on xcb: xvfb-run is not installed (apt-get install xvfb)")
    checks.run("no driver, CUDA or WebEngine files", partial(no_forbidden, b.root))
    checks.run("bundle contents", partial(contents, b.root))
    checks.run(
        "every kept Qt library and plugin finds its libraries (ldd)", partial(libraries_resolve, b.root)
    )
    checks.run("install.sh / uninstall.sh", partial(install_uninstall, b))
    checks.run(".deb control fields and contents", partial(deb, b, deb_path))


if __name__ == "__main__":
    raise SystemExit(main())
