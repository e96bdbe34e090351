"""Start-up time of the frozen ``gpumem-gui`` (the PyInstaller one-folder build), offscreen.

Each run spawns ``gpumem-gui --quit-after-paint --fake-gpus rtx4090_browser`` with
``QT_QPA_PLATFORM=offscreen`` and a throwaway HOME. The app prints ``first-paint <unix time>`` when the
window first paints and then quits; the benchmark reports, median of ``--runs`` (default 5) after one
warm-up run:

* spawn → first paint (what a user waits for), and
* spawn → process exit (first paint plus shutdown: stopping the GPU poller thread).

If the app has no ``--quit-after-paint``, it falls back to ``--self-test`` (start, estimate, draw the charts,
exit), says so, and reports spawn → exit only. ``--compare-source`` times the source install
(``.venv/bin/gpumem-gui``) the same way, and ``gpumem --version`` of both shows the CLI's start.

    python benchmarks/bench_frozen_start.py                      # unpacks dist/gpumem-<version>-...tar.gz
    python benchmarks/bench_frozen_start.py --bundle DIR --compare-source
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def project_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]


def bare_env(home: Path) -> dict[str, str]:
    runtime = home / "runtime"
    runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(runtime),
        "QT_QPA_PLATFORM": "offscreen",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }


def one_run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float | None, float, str]:
    """(spawn → first paint or None, spawn → exit, stdout) of one start."""
    t0 = time.time()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    t_exit = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench_frozen_start: {' '.join(cmd)} exited {r.returncode}: {r.stderr[-800:]}")
    paint = None
    for line in r.stdout.splitlines():
        if line.startswith("first-paint "):
            paint = float(line.split()[1]) - t0
    return paint, t_exit, r.stdout


def measure(exe: Path, runs: int, env: dict[str, str], cwd: Path, label: str) -> dict[str, float | str]:
    mode = "--quit-after-paint"
    cmd = [str(exe), mode, "--fake-gpus", "rtx4090_browser"]
    paint, _, _ = one_run(cmd, env, cwd)  # warm-up (page cache), also tells whether the flag exists
    if paint is None:
        mode = "--self-test"
        cmd = [str(exe), mode, "--fake-gpus", "rtx4090_browser"]
        print(f"{label}: no first-paint line from --quit-after-paint; timing --self-test to exit instead")
        one_run(cmd, env, cwd)
    paints, exits = [], []
    for _ in range(runs):
        p, e, _ = one_run(cmd, env, cwd)
        if p is not None:
            paints.append(p)
        exits.append(e)
    result: dict[str, float | str] = {"mode": mode, "exit_median_s": statistics.median(exits)}
    if paints and mode == "--quit-after-paint":
        result["first_paint_median_s"] = statistics.median(paints)
    runs_txt = ", ".join(f"{x:.2f}" for x in exits)
    paint_txt = (
        f"spawn -> first paint median {result['first_paint_median_s']:.2f} s; "
        if "first_paint_median_s" in result
        else ""
    )
    exit_txt = f"spawn -> exit median {result['exit_median_s']:.2f} s [{runs_txt}]"
    print(f"{label} ({mode}, {runs} runs): {paint_txt}{exit_txt}")
    return result


def cli_start(exe: Path, runs: int, env: dict[str, str], cwd: Path, label: str) -> float:
    times = []
    for _ in range(runs + 1):
        t0 = time.time()
        subprocess.run(
            [str(exe), "--version"], env=env, cwd=cwd, capture_output=True, check=True, timeout=TIMEOUT_S
        )
        times.append(time.time() - t0)
    med = statistics.median(times[1:])
    print(f"{label}: gpumem --version median {med:.2f} s")
    return med


def main(argv: list[str] | None = None) -> int:
    version = project_version()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--bundle", type=Path, help="an unpacked bundle folder (default: unpack the dist archive)"
    )
    ap.add_argument("--archive", type=Path, default=REPO / "dist" / f"gpumem-{version}-linux-x86_64.tar.gz")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--compare-source", action="store_true", help="also time .venv/bin/gpumem-gui")
    ap.add_argument("--json", type=Path, help="also write the medians to this JSON file")
    args = ap.parse_args(argv)
    results: dict[str, object] = {"archive": str(args.archive), "runs": args.runs}

    with tempfile.TemporaryDirectory(prefix="gpumem-bench-") as tmp:
        scratch = Path(tmp)
        bundle = args.bundle
        if bundle is None:
            if not args.archive.is_file():
                print(
                    f"bench_frozen_start: {args.archive} does not exist; run `make package`", file=sys.stderr
                )
                return 1
            with tarfile.open(args.archive) as tf:
                tf.extractall(scratch / "unpacked", filter="tar")
            bundle = next((scratch / "unpacked").iterdir())
        env = bare_env(scratch / "home")
        load = os.getloadavg()[0]
        print(
            f"frozen gpumem-gui start, offscreen, {bundle} (load average {load:.1f} on {os.cpu_count()} CPUs)"
        )
        results["frozen_gui"] = measure(bundle / "gpumem-gui", args.runs, env, scratch, "frozen")
        results["frozen_cli_version_s"] = cli_start(bundle / "gpumem", args.runs, env, scratch, "frozen")
        if args.compare_source:
            src = REPO / ".venv" / "bin"
            results["source_gui"] = measure(
                src / "gpumem-gui",
                args.runs,
                {**os.environ, **env, "PATH": os.environ["PATH"]},
                scratch,
                "source",
            )
            results["source_cli_version_s"] = cli_start(
                src / "gpumem",
                args.runs,
                {**os.environ, **env, "PATH": os.environ["PATH"]},
                scratch,
                "source",
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
