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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from qt_filter import is_forbidden, is_system_library  # noqa: E402

MiB = 1024 * 1024
# goals from the issue, and ceilings that catch a regression (e.g. QtQuick or WebEngine pulled in again)
GOAL_UNPACKED_MIB, GOAL_ARCHIVE_MIB = 150, 60
CEILING_UNPACKED_MIB, CEILING_ARCHIVE_MIB = 200, 85
SELF_TEST_TIMEOUT_S = 120
CLI_TIMEOUT_S = 60
VOLATILE_KEYS = frozenset({"taken_at"})  # gpus --json: when the snapshot was taken
DEB_DEPENDS = (
    "libxcb-cursor0",
    "libxkbcommon-x11-0",
    "libxcb-icccm4",
    "libxcb-keysyms1",
    "libxcb-shape0",
    "libxcb-render-util0",
    "libxcb-image0",
    "libxcb-randr0",
    "libxcb-xkb1",
    "libegl1",
    "libgl1",
    "libfontconfig1",
    "libdbus-1-3",
)
JSON_COMMANDS = (
    ("inspect", "Llama-3.1-8B", "--json"),
    ("estimate", "Llama-3.1-8B", "--seq", "4096", "--json"),
    ("models", "--json"),
    ("gpus", "--catalog", "--json"),
    ("gpus", "--fake-gpus", "rtx4090_browser", "--json"),
)


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


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def drop_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: drop_volatile(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, list):
        return [drop_volatile(v) for v in obj]
    return obj


def json_differences(a: Any, b: Any, path: str = "$") -> list[str]:
    """Where two JSON values differ (first few), as JSON paths."""
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = [f"{path}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            out += json_differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in json_differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def regular_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


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


def main(argv: list[str] | None = None) -> int:
    version = project_version()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, default=REPO / "dist" / f"gpumem-{version}-linux-x86_64.tar.gz")
    ap.add_argument("--deb", type=Path, default=REPO / "dist" / f"gpumem_{version}_amd64.deb")
    ap.add_argument("--source-gpumem", type=Path, default=REPO / ".venv" / "bin" / "gpumem")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args(argv)

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

    bundle_holder: dict[str, Path] = {}

    def unpack() -> str:
        assert not any(unpack_dir.iterdir()), "the unpack folder is not empty"
        with tarfile.open(args.archive) as tf:
            tf.extractall(unpack_dir, filter="tar")
        tops = list(unpack_dir.iterdir())
        assert len(tops) == 1 and tops[0].is_dir(), f"the archive should hold one folder, not {tops}"
        bundle_holder["b"] = tops[0]
        expected = {
            "gpumem",
            "gpumem-gui",
            "_internal",
            "resources",
            "gpumem.desktop",
            "gpumem.png",
            "gpumem.svg",
            "install.sh",
            "uninstall.sh",
            "README.txt",
        }
        missing = expected - {p.name for p in tops[0].iterdir()}
        assert not missing, f"missing from the folder: {sorted(missing)}"
        return tops[0].name

    checks.run("unpack into an empty folder", unpack)
    bundle = bundle_holder.get("b")
    if bundle is None:
        print(f"smoke: {checks.passed} passed, {len(checks.failed)} failed")
        return 1
    gpumem, gpumem_gui = bundle / "gpumem", bundle / "gpumem-gui"

    def versions() -> str:
        out = []
        for exe, prog in ((gpumem, "gpumem"), (gpumem_gui, "gpumem-gui")):
            r = run([str(exe), "--version"], env, scratch, CLI_TIMEOUT_S)
            assert r.returncode == 0, f"{prog} --version: exit {r.returncode}: {r.stderr[-500:]}"
            assert r.stdout.strip() == f"{prog} {version}", f"{prog} --version printed {r.stdout.strip()!r}"
            out.append(r.stdout.strip())
        return ", ".join(out)

    checks.run("--version (the pyproject version)", versions)

    for command in JSON_COMMANDS:

        def same_json(command: tuple[str, ...] = command) -> str:
            frozen = run([str(gpumem), *command], env, scratch, CLI_TIMEOUT_S)
            assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
            source = subprocess.run(
                [str(args.source_gpumem), *command], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
            )
            assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
            a, b = drop_volatile(json.loads(frozen.stdout)), drop_volatile(json.loads(source.stdout))
            diffs = json_differences(a, b)
            assert not diffs, "frozen and source differ: " + "; ".join(diffs[:5])
            return f"{len(frozen.stdout)} bytes of JSON, identical"

        checks.run("gpumem " + " ".join(command) + " == source install", same_json)

    def nvml_binding() -> str:
        # The real NVML backend: the same verdict as the source install (GPUs, or "no NVIDIA driver"), never
        # "nvidia-ml-py is not installed" (the binding is bundled; the driver's library is not).
        frozen = run([str(gpumem), "gpus", "--json"], env, scratch, CLI_TIMEOUT_S)
        assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
        source = subprocess.run(
            [str(args.source_gpumem), "gpus", "--json"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
        )
        assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
        a, b = json.loads(frozen.stdout), json.loads(source.stdout)
        reason = a.get("unavailable_reason") or ""
        assert "nvidia-ml-py" not in reason, f"the frozen app lacks the NVML binding: {reason}"

        def verdict(d: dict[str, Any]) -> tuple[Any, ...]:
            uuids = [dev.get("uuid") for dev in d.get("devices") or []]
            return (
                d.get("backend"),
                d.get("available"),
                d.get("unavailable_reason"),
                d.get("driver_version"),
                uuids,
            )

        assert verdict(a) == verdict(b), f"frozen {verdict(a)} != source {verdict(b)}"
        if a.get("available"):
            return f"{len(a['devices'])} GPU(s) through the driver's NVML, driver {a.get('driver_version')}"
        return f"same as the source install: {reason[:90]}"

    checks.run("gpumem gpus --json: NVML binding bundled, driver from the system", nvml_binding)

    def self_test(platform_env: dict[str, str], wrapper: list[str]) -> str:
        cmd = [*wrapper, str(gpumem_gui), "--self-test", "--fake-gpus", "rtx4090_browser"]
        t0 = time.perf_counter()
        try:
            r = run(cmd, platform_env, scratch, SELF_TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"no exit within {SELF_TEST_TIMEOUT_S} s") from e
        wall = time.perf_counter() - t0
        last = (r.stdout.strip().splitlines() or [""])[-1]
        assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-600:]} {r.stderr[-1200:]}"
        assert "self-test: ok" in r.stdout, f"no 'self-test: ok' line: {r.stdout[-600:]}"
        return f"exit 0 in {wall:.1f} s: {last}"

    checks.run("gpumem-gui --self-test --fake-gpus rtx4090_browser (offscreen)", lambda: self_test(env, []))
    xvfb_run = shutil.which("xvfb-run")
    if xvfb_run:
        xcb_env = {**env, "QT_QPA_PLATFORM": "xcb"}
        checks.run(
            "gpumem-gui --self-test on a real X server (xvfb-run, xcb)",
            lambda: self_test(xcb_env, [xvfb_run, "-a", "-s", "-screen 0 1280x800x24"]),
        )
    else:
        print("skip  self-test on xcb: xvfb-run is not installed (apt-get install xvfb)")

    def no_forbidden() -> str:
        everything = [p.relative_to(bundle).as_posix() for p in bundle.rglob("*")]
        bad = [p for p in everything if is_forbidden(p)]
        assert not bad, f"must never be bundled: {bad}"
        system = [p for p in everything if is_system_library(p)]
        assert not system, f"system libraries bundled: {system}"
        return f"none of libnvidia-ml*, libcuda*, QtWebEngine* among {len(everything)} entries"

    checks.run("no driver, CUDA or WebEngine files", no_forbidden)

    def contents() -> str:
        internal = bundle / "_internal"
        for rel in (
            "PySide6/QtOpenGL.abi3.so",
            "PySide6/QtOpenGLWidgets.abi3.so",
            "PySide6/Qt/plugins/platforms/libqxcb.so",
            "PySide6/Qt/plugins/platforms/libqoffscreen.so",
            "gpumem_gui/resources/models.json",
            "gpumem_gui/resources/gpus.json",
        ):
            assert (internal / rel).is_file(), f"_internal/{rel} is missing"
        res = internal / "gpumem_gui" / "resources"
        assert not (res / "tools").exists(), "resources/tools (build-time only) is bundled"
        shipped = {p.name for p in (REPO / "resources" / "fake_gpus").glob("*.json")}
        bundled = {p.name for p in (res / "fake_gpus").glob("*.json")}
        assert shipped == bundled, f"fake_gpus differ: repo {sorted(shipped)} vs bundle {sorted(bundled)}"
        assert (bundle / "resources").resolve() == res.resolve(), (
            "resources link does not lead to the resources"
        )
        qt = [p for p in internal.rglob("*") if "QtQuick" in p.name or "QtQml" in p.name or p.suffix == ".qm"]
        assert not qt, f"dropped Qt files are bundled: {qt[:5]}"
        return f"QtOpenGL(Widgets), xcb+offscreen, resources ({len(bundled)} fake-GPU scenarios), no tools/"

    checks.run("bundle contents", contents)

    def libraries_resolve() -> str:
        internal = bundle / "_internal"
        lib_path = f"{internal}:{internal / 'PySide6' / 'Qt' / 'lib'}"
        targets = [p for p in regular_files(internal / "PySide6") if p.suffix == ".so" or ".so." in p.name]
        targets = [p for p in targets if is_elf(p)]
        missing: dict[str, str] = {}
        for p in targets:
            r = subprocess.run(
                ["ldd", str(p)],
                capture_output=True,
                text=True,
                env={"LD_LIBRARY_PATH": lib_path, "PATH": "/usr/bin:/bin"},
                timeout=30,
            )
            for line in r.stdout.splitlines():
                if "not found" in line:
                    missing[p.relative_to(bundle).as_posix()] = line.strip()
        assert not missing, f"unresolved libraries: {missing}"
        return f"{len(targets)} Qt/PySide6 libraries and plugins"

    checks.run("every kept Qt library and plugin finds its libraries (ldd)", libraries_resolve)

    def install_uninstall() -> str:
        prefix = scratch / "prefix"
        ienv = {**env, "PREFIX": str(prefix)}
        r = run(["/bin/sh", str(bundle / "install.sh")], ienv, scratch, 120)
        assert r.returncode == 0, f"install.sh: exit {r.returncode}: {r.stdout} {r.stderr}"
        for rel in (
            "bin/gpumem",
            "bin/gpumem-gui",
            "share/applications/gpumem.desktop",
            "share/icons/hicolor/256x256/apps/gpumem.png",
            "share/icons/hicolor/scalable/apps/gpumem.svg",
            "lib/gpumem/uninstall.sh",
        ):
            assert (prefix / rel).exists(), f"install.sh did not make {rel}"
        desktop = (prefix / "share/applications/gpumem.desktop").read_text()
        assert f"Exec={prefix}/bin/gpumem-gui" in desktop, (
            "the menu entry does not point at the installed program"
        )
        v = run([str(prefix / "bin" / "gpumem"), "--version"], env, scratch, CLI_TIMEOUT_S)
        assert v.stdout.strip() == f"gpumem {version}", f"installed gpumem --version: {v.stdout} {v.stderr}"
        validate = shutil.which("desktop-file-validate")
        if validate:
            d = subprocess.run(
                [validate, str(prefix / "share/applications/gpumem.desktop")], capture_output=True, text=True
            )
            assert d.returncode == 0 and not d.stdout.strip(), f"desktop-file-validate: {d.stdout}"
        r = run(["/bin/sh", str(prefix / "lib" / "gpumem" / "uninstall.sh")], ienv, scratch, 60)
        assert r.returncode == 0, f"uninstall.sh: exit {r.returncode}: {r.stderr}"
        left = [p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if not p.is_dir()]
        assert not left, f"uninstall.sh left {left}"
        return "install into a scratch PREFIX, run through the bin/ link, uninstall leaves nothing"

    checks.run("install.sh / uninstall.sh", install_uninstall)

    def deb() -> str:
        assert args.deb.is_file(), f"{args.deb} does not exist"
        fields = subprocess.run(["dpkg-deb", "-f", str(args.deb)], capture_output=True, text=True, check=True)
        control = dict(
            line.split(": ", 1)
            for line in fields.stdout.splitlines()
            if ": " in line and not line[0].isspace()
        )
        assert control.get("Package") == "gpumem" and control.get("Architecture") == "amd64", control
        depends = [d.strip().split(" ")[0] for d in control.get("Depends", "").split(",")]
        missing = [d for d in DEB_DEPENDS if d not in depends]
        assert not missing, f"Depends lacks {missing}"
        root = scratch / "deb"
        subprocess.run(["dpkg-deb", "-x", str(args.deb), str(root)], check=True)
        for rel in (
            "usr/share/applications/gpumem.desktop",
            "usr/share/icons/hicolor/256x256/apps/gpumem.png",
        ):
            assert (root / rel).is_file(), f"the .deb lacks /{rel}"
        for name in ("gpumem", "gpumem-gui"):
            assert os.readlink(root / "usr" / "bin" / name) == f"/opt/gpumem/{name}", f"/usr/bin/{name} link"
        bad = [p.as_posix() for p in root.rglob("*") if is_forbidden(p.name)]
        assert not bad, f"forbidden files in the .deb: {bad}"
        v = run([str(root / "opt" / "gpumem" / "gpumem"), "--version"], env, scratch, CLI_TIMEOUT_S)
        assert v.stdout.strip() == f"gpumem {version}", f"gpumem from the .deb: {v.stdout} {v.stderr}"
        return f"Version {control.get('Version')}, Depends: {control.get('Depends')}"

    checks.run(".deb control fields and contents", deb)

    total, lines = size_report(bundle, [args.archive, args.deb])
    print("\n".join(lines), flush=True)

    def sizes() -> str:
        archive = args.archive.stat().st_size
        assert total <= CEILING_UNPACKED_MIB * MiB, (
            f"unpacked {total / MiB:.0f} MiB > {CEILING_UNPACKED_MIB} MiB"
        )
        assert archive <= CEILING_ARCHIVE_MIB * MiB, (
            f"archive {archive / MiB:.0f} MiB > {CEILING_ARCHIVE_MIB} MiB"
        )
        goals = []
        for what, value, goal in (
            ("unpacked", total, GOAL_UNPACKED_MIB),
            ("archive", archive, GOAL_ARCHIVE_MIB),
        ):
            goals.append(
                f"{what} {value / MiB:.1f} MiB ({'meets' if value < goal * MiB else 'over'} goal {goal})"
            )
        return ", ".join(goals)

    checks.run(
        f"sizes under the regression ceilings ({CEILING_UNPACKED_MIB}/{CEILING_ARCHIVE_MIB} MiB)", sizes
    )

    if args.keep:
        print(f"kept {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"smoke: {checks.passed} passed, {len(checks.failed)} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
