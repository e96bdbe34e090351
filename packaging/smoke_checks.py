"""The checks of ``packaging/smoke_test.py``, one function each, on an unpacked archive (a :class:`Bundle`).

Each check returns a one-line detail or raises (an ``AssertionError`` saying what is wrong); the smoke test
runs them through ``Checks.run``, which prints ``ok`` or ``FAIL`` and goes on with the next.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qt_filter import is_forbidden, is_system_library

REPO = Path(__file__).resolve().parent.parent
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
TOP_LEVEL = frozenset(
    {
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
)


@dataclass(frozen=True)
class Bundle:
    """The unpacked archive and where its programs run."""

    root: Path  # the archive's one folder
    scratch: Path  # the working directory of every program run
    env: dict[str, str]  # the bare environment
    version: str  # the pyproject version
    source_gpumem: Path  # the source install's ``gpumem``, to compare JSON with

    @property
    def gpumem(self) -> Path:
        return self.root / "gpumem"

    @property
    def gpumem_gui(self) -> Path:
        return self.root / "gpumem-gui"


# ---- helpers -----------------------------------------------------------------------------------------------


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


# ---- the checks --------------------------------------------------------------------------------------------


def unpack(archive: Path, unpack_dir: Path, found: dict[str, Path]) -> str:
    """Unpack ``archive`` into the empty ``unpack_dir``; its one folder goes to ``found["b"]``."""
    assert not any(unpack_dir.iterdir()), "the unpack folder is not empty"
    with tarfile.open(archive) as tf:
        tf.extractall(unpack_dir, filter="tar")
    tops = list(unpack_dir.iterdir())
    assert len(tops) == 1 and tops[0].is_dir(), f"the archive should hold one folder, not {tops}"
    found["b"] = tops[0]
    missing = TOP_LEVEL - {p.name for p in tops[0].iterdir()}
    assert not missing, f"missing from the folder: {sorted(missing)}"
    return tops[0].name


def versions(b: Bundle) -> str:
    out = []
    for exe, prog in ((b.gpumem, "gpumem"), (b.gpumem_gui, "gpumem-gui")):
        r = run([str(exe), "--version"], b.env, b.scratch, CLI_TIMEOUT_S)
        assert r.returncode == 0, f"{prog} --version: exit {r.returncode}: {r.stderr[-500:]}"
        assert r.stdout.strip() == f"{prog} {b.version}", f"{prog} --version printed {r.stdout.strip()!r}"
        out.append(r.stdout.strip())
    return ", ".join(out)


def same_json(b: Bundle, command: tuple[str, ...]) -> str:
    frozen = run([str(b.gpumem), *command], b.env, b.scratch, CLI_TIMEOUT_S)
    assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
    source = subprocess.run(
        [str(b.source_gpumem), *command], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
    x, y = drop_volatile(json.loads(frozen.stdout)), drop_volatile(json.loads(source.stdout))
    diffs = json_differences(x, y)
    assert not diffs, "frozen and source differ: " + "; ".join(diffs[:5])
    return f"{len(frozen.stdout)} bytes of JSON, identical"


def trace_with_a_python(b: Bundle, python: str) -> str:
    """The binary bundles no torch: ``gpumem trace --python`` runs the worker (shipped as plain files) in a
    Python that has it, and gets the same peak as the source install."""
    command = ["trace", "Llama-3.2-1B", "--seq", "64", "--json", "--no-cache", "--python", python]
    frozen = run([str(b.gpumem), *command], b.env, b.scratch, 300)
    assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
    doc = json.loads(frozen.stdout)
    assert doc["source"] == "trace" and doc["versions"].get("torch"), doc
    source = subprocess.run([str(b.source_gpumem), *command], capture_output=True, text=True, timeout=300)
    assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
    assert json.loads(source.stdout)["phases"] == doc["phases"], "frozen and source traces differ"
    no_python = run([str(b.gpumem), *command[:-2]], b.env, b.scratch, CLI_TIMEOUT_S)
    assert no_python.returncode == 2 and "--python" in no_python.stderr, no_python.stderr[-300:]
    return f"peak {doc['peak_bytes']:,} B traced with {python} (torch {doc['versions']['torch']})"


def _gpus_verdict(d: dict[str, Any]) -> tuple[Any, ...]:
    uuids = [dev.get("uuid") for dev in d.get("devices") or []]
    return (
        d.get("backend"),
        d.get("available"),
        d.get("unavailable_reason"),
        d.get("driver_version"),
        uuids,
    )


def nvml_binding(b: Bundle) -> str:
    # The real NVML backend: the same verdict as the source install (GPUs, or "no NVIDIA driver"), never
    # "nvidia-ml-py is not installed" (the binding is bundled; the driver's library is not).
    frozen = run([str(b.gpumem), "gpus", "--json"], b.env, b.scratch, CLI_TIMEOUT_S)
    assert frozen.returncode == 0, f"frozen: exit {frozen.returncode}: {frozen.stderr[-800:]}"
    source = subprocess.run(
        [str(b.source_gpumem), "gpus", "--json"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert source.returncode == 0, f"source install: exit {source.returncode}: {source.stderr[-800:]}"
    x, y = json.loads(frozen.stdout), json.loads(source.stdout)
    reason = x.get("unavailable_reason") or ""
    assert "nvidia-ml-py" not in reason, f"the frozen app lacks the NVML binding: {reason}"
    assert _gpus_verdict(x) == _gpus_verdict(y), f"frozen {_gpus_verdict(x)} != source {_gpus_verdict(y)}"
    if x.get("available"):
        return f"{len(x['devices'])} GPU(s) through the driver's NVML, driver {x.get('driver_version')}"
    return f"same as the source install: {reason[:90]}"


def cluster_client(b: Bundle) -> str:
    # The cluster view's HTTP client is bundled (requests, urllib3, ssl): an https server that is not there
    # is "unreachable: Connection refused", not a missing module or "SSL module is not available".
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}"
    r = run([str(b.gpumem), "gpus", "--prometheus", url, "--json"], b.env, b.scratch, CLI_TIMEOUT_S)
    assert r.returncode == 1, f"exit {r.returncode} (want 1: server not read): {r.stderr[-800:]}"
    reason = json.loads(r.stdout).get("unavailable_reason") or ""
    assert "unreachable" in reason and "refused" in reason.lower(), f"unexpected reason: {reason}"
    return f"requests + TLS bundled: {reason[:80]}"


def self_test(b: Bundle, platform_env: dict[str, str], wrapper: list[str]) -> str:
    cmd = [*wrapper, str(b.gpumem_gui), "--self-test", "--fake-gpus", "rtx4090_browser"]
    t0 = time.perf_counter()
    try:
        r = run(cmd, platform_env, b.scratch, SELF_TEST_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"no exit within {SELF_TEST_TIMEOUT_S} s") from e
    wall = time.perf_counter() - t0
    last = (r.stdout.strip().splitlines() or [""])[-1]
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-600:]} {r.stderr[-1200:]}"
    assert "self-test: ok" in r.stdout, f"no 'self-test: ok' line: {r.stdout[-600:]}"
    return f"exit 0 in {wall:.1f} s: {last}"


def no_forbidden(bundle: Path) -> str:
    everything = [p.relative_to(bundle).as_posix() for p in bundle.rglob("*")]
    bad = [p for p in everything if is_forbidden(p)]
    assert not bad, f"must never be bundled: {bad}"
    system = [p for p in everything if is_system_library(p)]
    assert not system, f"system libraries bundled: {system}"
    return f"none of libnvidia-ml*, libcuda*, QtWebEngine* among {len(everything)} entries"


def contents(bundle: Path) -> str:
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
    assert (bundle / "resources").resolve() == res.resolve(), "resources link does not lead to the resources"
    qt = [p for p in internal.rglob("*") if "QtQuick" in p.name or "QtQml" in p.name or p.suffix == ".qm"]
    assert not qt, f"dropped Qt files are bundled: {qt[:5]}"
    return f"QtOpenGL(Widgets), xcb+offscreen, resources ({len(bundled)} fake-GPU scenarios), no tools/"


def libraries_resolve(bundle: Path) -> str:
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


def install_uninstall(b: Bundle) -> str:
    prefix = b.scratch / "prefix"
    ienv = {**b.env, "PREFIX": str(prefix)}
    r = run(["/bin/sh", str(b.root / "install.sh")], ienv, b.scratch, 120)
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
    v = run([str(prefix / "bin" / "gpumem"), "--version"], b.env, b.scratch, CLI_TIMEOUT_S)
    assert v.stdout.strip() == f"gpumem {b.version}", f"installed gpumem --version: {v.stdout} {v.stderr}"
    validate = shutil.which("desktop-file-validate")
    if validate:
        d = subprocess.run(
            [validate, str(prefix / "share/applications/gpumem.desktop")], capture_output=True, text=True
        )
        assert d.returncode == 0 and not d.stdout.strip(), f"desktop-file-validate: {d.stdout}"
    r = run(["/bin/sh", str(prefix / "lib" / "gpumem" / "uninstall.sh")], ienv, b.scratch, 60)
    assert r.returncode == 0, f"uninstall.sh: exit {r.returncode}: {r.stderr}"
    left = [p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if not p.is_dir()]
    assert not left, f"uninstall.sh left {left}"
    return "install into a scratch PREFIX, run through the bin/ link, uninstall leaves nothing"


def deb(b: Bundle, deb_path: Path) -> str:
    assert deb_path.is_file(), f"{deb_path} does not exist"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb_path)], capture_output=True, text=True, check=True)
    control = dict(
        line.split(": ", 1) for line in fields.stdout.splitlines() if ": " in line and not line[0].isspace()
    )
    assert control.get("Package") == "gpumem" and control.get("Architecture") == "amd64", control
    depends = [d.strip().split(" ")[0] for d in control.get("Depends", "").split(",")]
    missing = [d for d in DEB_DEPENDS if d not in depends]
    assert not missing, f"Depends lacks {missing}"
    root = b.scratch / "deb"
    subprocess.run(["dpkg-deb", "-x", str(deb_path), str(root)], check=True)
    for rel in (
        "usr/share/applications/gpumem.desktop",
        "usr/share/icons/hicolor/256x256/apps/gpumem.png",
    ):
        assert (root / rel).is_file(), f"the .deb lacks /{rel}"
    for name in ("gpumem", "gpumem-gui"):
        assert os.readlink(root / "usr" / "bin" / name) == f"/opt/gpumem/{name}", f"/usr/bin/{name} link"
    bad = [p.as_posix() for p in root.rglob("*") if is_forbidden(p.name)]
    assert not bad, f"forbidden files in the .deb: {bad}"
    v = run([str(root / "opt" / "gpumem" / "gpumem"), "--version"], b.env, b.scratch, CLI_TIMEOUT_S)
    assert v.stdout.strip() == f"gpumem {b.version}", f"gpumem from the .deb: {v.stdout} {v.stderr}"
    return f"Version {control.get('Version')}, Depends: {control.get('Depends')}"


def sizes(archive_path: Path, total: int) -> str:
    archive = archive_path.stat().st_size
    assert total <= CEILING_UNPACKED_MIB * MiB, f"unpacked {total / MiB:.0f} MiB > {CEILING_UNPACKED_MIB} MiB"
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
