"""Measuring for ``benchmarks/report.py``: every benchmark of one run, collected into one dict.

The core and the peers run in this process (``bench_core.py``, ``peers_speed.py``); the window, the poll cost,
the app's memory and the frozen binary's start each run in a fresh interpreter (no Qt in this process).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_core, peers_speed

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Options:
    min_time: float = 0.5
    repeat: int = 3
    min_runs: int = 5
    peers: bool = True
    peer_min_time: float = 1.0
    meta_builds: int = 5
    app: bool = True
    ui_runs: int = 5
    ui_changes: int = 50
    poll_min_time: float = 0.5
    soak_s: float = 600.0
    soak_every_s: float = 30.0
    cli_runs: int = 5
    frozen_runs: int = 5
    trace_runs: int = 3  # 0: trace mode not measured
    cluster_rounds: int = 5
    cluster_hosts: int = 125  # issue 17's scale: 1,000 GPUs on 125 hosts
    flip_soak: bool = False  # report.py --soak: the 30-minute soak with a flipping local target (issue 18)
    flip_soak_s: float = 1800.0
    flip_soak_every_s: float = 60.0

    @classmethod
    def quick(cls, **kw: object) -> Options:
        base = {
            "min_time": 0.01,
            "repeat": 1,
            "min_runs": 1,
            "peer_min_time": 0.05,
            "meta_builds": 1,
            "ui_runs": 1,
            "ui_changes": 3,
            "trace_runs": 0,
            "poll_min_time": 0.01,
            "soak_s": 3.0,
            "soak_every_s": 1.0,
            "cli_runs": 1,
            "frozen_runs": 1,
            "cluster_rounds": 1,
            "cluster_hosts": 4,
            "flip_soak_s": 4.0,
            "flip_soak_every_s": 1.0,
        }
        return cls(**{**base, **kw})  # type: ignore[arg-type]


# ---- measuring ---------------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _script(name: str, *args: str, timeout: float) -> dict:
    """Run ``benchmarks/<name>`` with ``--json`` in a fresh interpreter (no Qt in this process)."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout)


def cli_process(runs: int) -> float:
    """Median wall seconds of a fresh ``gpumem estimate <catalog id> --json`` process (what a script pays)."""
    code = "import sys; from gpumem_gui.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "estimate", "meta-llama/Llama-3.1-8B", "--seq", "4096", "--json"]
    times = []
    for i in range(runs + 1):  # the first run warms the page cache and is not counted
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        if proc.returncode != 0 or '"total_bytes"' not in proc.stdout:
            raise SystemExit(f"gpumem estimate failed (rc {proc.returncode}): {proc.stderr[-500:]}")
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _current_archive() -> Path | None:
    """The dist archive of this version, if it was built after the last commit (else it may be stale)."""
    with (REPO / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    archive = REPO / "dist" / f"gpumem-{version}-linux-x86_64.tar.gz"
    committed = _git("log", "-1", "--format=%ct")
    if archive.is_file() and committed and archive.stat().st_mtime >= int(committed):
        return archive
    return None


def frozen_start(runs: int) -> dict:
    archive = _current_archive()
    if archive is None:
        return {"missing": "no archive in dist/ built after the last commit (run `make package` first)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "frozen.json"
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "bench_frozen_start.py"),
                "--runs",
                str(runs),
                "--archive",
                str(archive),
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0 or not out.is_file():
            return {"missing": f"bench_frozen_start.py failed (rc {proc.returncode}): {proc.stderr[-300:]}"}
        return json.loads(out.read_text())


FLIP_SOAK_RECORD = REPO / "benchmarks" / "results" / "soak_flip.json"


def flip_soak(opts: Options, data: dict, say: object) -> dict | None:
    """With ``--soak``: the app's RSS while a local target's verdict flips (``soak_flip.py``), kept in
    ``benchmarks/results/soak_flip.json`` (not for a ``--quick`` run); without it: that last recorded run,
    marked as such (a 30-minute soak is not part of every ``make bench``)."""
    if opts.flip_soak:
        say(f"soak with a flipping local target, {opts.flip_soak_s:g} s")  # type: ignore[operator]
        r = _script(
            "soak_flip.py",
            *("--seconds", str(opts.flip_soak_s), "--every", str(opts.flip_soak_every_s)),
            timeout=opts.flip_soak_s + 600,
        )
        r.update(date=data["date"], commit=data["commit"], dirty=data["dirty"])
        if opts.flip_soak_s >= 600:  # a real soak, not a smoke run: keep it for the pages that do not soak
            FLIP_SOAK_RECORD.parent.mkdir(parents=True, exist_ok=True)
            FLIP_SOAK_RECORD.write_text(json.dumps(r, indent=2) + "\n")
        return r
    if FLIP_SOAK_RECORD.is_file():
        return {**json.loads(FLIP_SOAK_RECORD.read_text()), "recorded": True}
    return None


def collect(opts: Options, log: bool = True) -> dict:
    def say(msg: str) -> None:
        if log:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    data: dict = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": bench_core.machine(),
        "load_start": os.getloadavg(),
        "options": opts.__dict__,
    }
    say("core benchmarks")
    results = bench_core.run_all(opts.min_time, None, opts.repeat, opts.min_runs)
    data["core"] = [r.__dict__ for r in results]
    say("cProfile of one estimate")
    top, per = bench_core.profile_estimate()
    data["profile"] = {"rows": top, "per_call_s": per}
    seqs = [
        round(1024 + (131072 - 1024) * i / (bench_core.SWEEP_POINTS - 1))
        for i in range(bench_core.SWEEP_POINTS)
    ]
    if opts.peers:
        say("llm-analysis")
        data["llm_analysis"] = peers_speed.llm_analysis(seqs, opts.peer_min_time)
        say("accelerate meta model")
        data["accelerate"] = peers_speed.accelerate(opts.meta_builds)
    else:
        data["llm_analysis"] = data["accelerate"] = {"missing": "peers skipped (--no-peers)"}
    say("gpumem estimate as a process")
    data["cli_process_s"] = cli_process(opts.cli_runs)
    if opts.trace_runs:
        say("trace mode")
        data["trace"] = _script("bench_trace.py", "--runs", str(opts.trace_runs), timeout=1800)
    if opts.app:
        say("window: cold start, form change to chart")
        data["ui"] = _script(
            "bench_ui.py", "--runs", str(opts.ui_runs), "--changes", str(opts.ui_changes), timeout=1800
        )
        say(f"cluster view: {opts.cluster_hosts * 8:,} GPUs behind a real Prometheus")
        data["cluster"] = _script(
            "bench_cluster.py",
            "--rounds",
            str(opts.cluster_rounds),
            "--hosts",
            str(opts.cluster_hosts),
            timeout=600,
        )
        say("poll cost")
        data["poll"] = _script("bench_poll.py", "--min-time", str(opts.poll_min_time), timeout=600)
        say(f"app memory, {opts.soak_s:g} s of polling")
        data["app_memory"] = _script(
            "app_memory.py",
            "--seconds",
            str(opts.soak_s),
            "--every",
            str(opts.soak_every_s),
            timeout=opts.soak_s + 300,
        )
        data["flip_soak"] = flip_soak(opts, data, say)
        say("frozen binary start")
        data["frozen"] = frozen_start(opts.frozen_runs)
    data["load_end"] = os.getloadavg()
    return data
