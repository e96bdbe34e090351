"""Regenerate ``docs/performance.md``: every speed and memory figure, measured in one run on this machine.

``make bench`` runs ``.venv/bin/python benchmarks/report.py --out docs/performance.md --readme README.md``:

1. the core (``bench_core.py``): single estimates, the 256-point sweep, the solvers; and a cProfile;
2. the peers in the same run (``peers_speed.py``): llm-analysis per estimate, accelerate's meta-model build
   (skipped with a note when their scratch environments are missing: ``make peers`` creates them);
3. our CLI as a user runs it (a fresh ``gpumem estimate --json`` process);
4. the app: cold start to first paint and form change to redrawn chart (``bench_ui.py``), poll cost per GPU
   on fake backends (``bench_poll.py``), resident memory after start and after ``--soak-seconds`` (default
   600) of polling 8 fake GPUs at 20 Hz (``app_memory.py``), and the frozen binary's start when
   ``dist/`` holds an archive built after the last commit (``bench_frozen_start.py``).

The README's speed block (between ``<!-- perf:begin -->`` and ``<!-- perf:end -->``) is rewritten from the
same numbers with ``--readme``. ``--quick`` shrinks every measurement (a smoke run: the test suite uses it
so this script cannot rot; its numbers mean nothing). A full run takes about 15 minutes, 10 of them the soak.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import bench_core, peers_speed  # noqa: E402

MiB = 1 << 20
GOAL_PEER_X = 10
GOAL_META_X = 10_000
GOAL_COLD_START_S = 1.0
GOAL_REDRAW_MS = 16.0
TRAIN_UNCACHED = "estimate: training full ZeRO-3 dp8 x TP2, uncached"
SWEEP = f"sweep: {bench_core.SWEEP_POINTS} points over seq (one process)"
README_BEGIN, README_END = "<!-- perf:begin -->", "<!-- perf:end -->"


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
            "poll_min_time": 0.01,
            "soak_s": 3.0,
            "soak_every_s": 1.0,
            "cli_runs": 1,
            "frozen_runs": 1,
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
    if opts.app:
        say("window: cold start, form change to chart")
        data["ui"] = _script(
            "bench_ui.py", "--runs", str(opts.ui_runs), "--changes", str(opts.ui_changes), timeout=1800
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
        say("frozen binary start")
        data["frozen"] = frozen_start(opts.frozen_runs)
    data["load_end"] = os.getloadavg()
    return data


# ---- rendering ---------------------------------------------------------------------------------------------

fmt_time = bench_core.fmt_time


def _mib(b: float) -> str:
    return f"{b / MiB:.1f} MiB"


def _x(a: float, b: float) -> str:
    """How many times ``a`` is ``b`` (a ratio of times), written for a reader."""
    r = a / b
    if r < 1:
        return f"{r:.3f}x (ours {1 / r:,.0f}x slower)" if r < 0.1 else f"{r:.2f}x (ours slower)"
    return f"{r:,.0f}x" if r >= 100 else f"{r:.1f}x"


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def goals(data: dict) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) rows."""
    core = {r["name"]: r for r in data["core"]}
    base = core[bench_core.BASELINE]["median_s"]
    sweep = core[SWEEP]["median_s"]
    rows = [
        (
            "one inference estimate < 50 µs",
            f"{fmt_time(base)} (Llama-3.1-8B, batch 1, 4096 tokens)",
            _met(base < bench_core.GOAL_ESTIMATE_S),
        ),
        (
            f"{bench_core.SWEEP_POINTS}-point sweep < 20 ms",
            f"{fmt_time(sweep)} ({fmt_time(sweep / bench_core.SWEEP_POINTS)} a point)",
            _met(sweep < bench_core.GOAL_SWEEP_S),
        ),
    ]
    la = data["llm_analysis"]
    if "missing" in la:
        rows.append((f"≥ {GOAL_PEER_X}x faster than llm-analysis", f"not measured: {la['missing']}", "-"))
    else:
        rows.append(
            (
                f"≥ {GOAL_PEER_X}x faster than llm-analysis, inference estimate",
                f"{_x(la['infer_s'], base)} ({fmt_time(la['infer_s'])} vs ours {fmt_time(base)})",
                _met(la["infer_s"] / base >= GOAL_PEER_X),
            )
        )
        ours_train = core[TRAIN_UNCACHED]["median_s"]
        slower = ours_train / la["train_s"]
        rows.append(
            (
                f"≥ {GOAL_PEER_X}x faster than llm-analysis, training estimate (ZeRO-3, dp 8 x TP 2)",
                f"we are {slower:,.0f}x **slower** ({fmt_time(ours_train)} uncached vs "
                f"{fmt_time(la['train_s'])})"
                if slower > 1
                else _x(la["train_s"], ours_train),
                _met(la["train_s"] / ours_train >= GOAL_PEER_X),
            )
        )
    acc = data["accelerate"]
    if "missing" in acc:
        rows.append((f"≥ {GOAL_META_X:,}x faster than a meta model", f"not measured: {acc['missing']}", "-"))
    else:
        rows.append(
            (
                f"≥ {GOAL_META_X:,}x faster than building a meta model (warm, in one process)",
                f"{_x(acc['warm_build_s'], base)} ({fmt_time(acc['warm_build_s'])} a build)",
                _met(acc["warm_build_s"] / base >= GOAL_META_X),
            )
        )
        rows.append(
            (
                f"≥ {GOAL_META_X:,}x faster than a meta model as its CLI pays it (imports + first build)",
                f"{_x(acc['cold_s'], base)} ({fmt_time(acc['cold_s'])})",
                _met(acc["cold_s"] / base >= GOAL_META_X),
            )
        )
    ui = data.get("ui")
    if ui:
        cs = ui["cold_start"]["first_paint_s_median"]
        rows.append(("cold start to first painted window < 1 s", f"{cs:.2f} s", _met(cs < GOAL_COLD_START_S)))
        fc = ui["form_change_to_chart"]
        nd = fc["redraw_ms_median_no_debounce"]
        rows.append(
            (
                "form change to redrawn chart < 16 ms",
                f"{nd:.1f} ms without the debounce; {fc['redraw_ms_median_with_debounce']:.1f} ms with it",
                _met(nd < GOAL_REDRAW_MS),
            )
        )
    am = data.get("app_memory")
    if am:
        grow = am["rss_second_half_growth_bytes"]
        rows.append(
            (
                f"resident memory bounded over {am['seconds'] / 60:g} min of polling",
                f"{_mib(am['rss_first_paint_bytes'])} at first paint, {_mib(am['rss_end_bytes'])} at the "
                f"end; {grow / MiB:+.1f} MiB over the second half",
                "met" if grow < 2 * MiB else "**growing**",
            )
        )
    return rows


def _table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render(data: dict) -> str:
    m = data["machine"]
    core = {r["name"]: r for r in data["core"]}
    base = core[bench_core.BASELINE]["median_s"]
    o = data["options"]
    L: list[str] = []
    add = L.append
    add("# Performance")
    add("")
    add(
        f"Generated by `make bench` (`benchmarks/report.py`; do not edit by hand) on {data['date']} at "
        f"commit `{data['commit']}`{' (with uncommitted changes)' if data['dirty'] else ''}."
    )
    add("Speed goals are the ones issue 8 set; every figure below was measured in this one run.")
    add("")
    add("## Machine")
    add("")
    add(
        f"{m['nproc']} CPUs ({m['cpu']}), {m['python']}, {m['platform']}. Load average "
        f"{data['load_start'][0]:.2f} at the start, {data['load_end'][0]:.2f} at the end. This machine is "
        "shared with other work, so absolute times move by tens of percent between runs; ratios measured in "
        "the same "
        'run (the "x one estimate" column, the peer ratios) are steadier. Core rows are the lowest of '
        f"{o['repeat']} medians (each over ≥ {o['min_time']:g} s and ≥ {o['min_runs']} calls, garbage "
        "collector off while timing)."
    )
    add("")
    add("## Goals")
    add("")
    L += _table(["goal", "measured", "verdict"], [list(r) for r in goals(data)], "llr")
    add("")
    add("## Core")
    add("")
    L += _table(
        ["benchmark", "median", "runs", "x one estimate", "note"],
        [
            [r["name"], fmt_time(r["median_s"]), str(r["runs"]), f"{r['median_s'] / base:.2f}", r["note"]]
            for r in data["core"]
        ],
        "lrrrl",
    )
    add("")
    add(
        '"Uncached" training rows clear `estimate_training`\'s memo of the step replay (an `lru_cache` '
        "keyed by spec, run and pipeline stage) before each call: what a form change or a fit candidate "
        "costs the first time. A training estimate replays forward, backward and the optimizer step tensor "
        "by tensor; that is the price of being within 0.01 % of PyTorch's tracker (`docs/validation.md`)."
    )
    add("")
    add("### Side by side with the peers (same run)")
    add("")
    L += _peer_section(data, base)
    add("")
    add("### Where the time goes")
    add("")
    prof = data["profile"]
    add(
        f"cProfile over 2000 baseline estimates ({fmt_time(prof['per_call_s'])} a call under the profiler, "
        "which inflates every call: read the shares), top functions by own time:"
    )
    add("")
    L += _table(
        ["function", "own time %", "cumulative %", "calls per estimate"],
        [[f"`{w}`", f"{own:.1f}", f"{cum:.1f}", str(calls)] for w, own, cum, calls in prof["rows"]],
        "lrrr",
    )
    add("")
    if data.get("ui"):
        L += _app_section(data)
    else:
        add("## App")
        add("")
        add("Not measured in this run (`--no-app`).")
        add("")
    add("## Rerun")
    add("")
    add("```bash")
    add("make peers   # once: scratch environments for llm-analysis and accelerate (needs PyPI)")
    add("make bench   # this page and the README's speed block, ~15 minutes")
    add(".venv/bin/python benchmarks/report.py --out /tmp/perf.md --soak-seconds 60 --no-peers   # shorter")
    add("```")
    add("")
    add("`benchmarks/README.md` describes each script; each also runs on its own and prints a table.")
    return "\n".join(L) + "\n"


def _peer_section(data: dict, base: float) -> list[str]:
    core = {r["name"]: r for r in data["core"]}
    la, acc = data["llm_analysis"], data["accelerate"]
    rows: list[list[str]] = []
    if "missing" not in la:
        v = f"llm-analysis {la['version']}"
        sweep = core[SWEEP]["median_s"]
        tr_unc = core[TRAIN_UNCACHED]["median_s"]
        rows += [
            [
                "inference estimate, Llama-3.1-8B b1 s4096",
                fmt_time(base),
                f"{v}: {fmt_time(la['infer_s'])}",
                _x(la["infer_s"], base),
            ],
            [
                f"{bench_core.SWEEP_POINTS}-point sweep over seq",
                fmt_time(sweep),
                f"{v}: {fmt_time(la['sweep_s'])}",
                _x(la["sweep_s"], sweep),
            ],
            [
                "training estimate, full, ZeRO-3, dp 8 x TP 2, b1 s4096 (ours uncached)",
                fmt_time(tr_unc),
                f"{v}: {fmt_time(la['train_s'])}",
                _x(la["train_s"], tr_unc),
            ],
        ]
    if "missing" not in acc:
        v = f"accelerate {acc['version']} (transformers {acc['transformers']}, torch {acc['torch']})"
        rows += [
            [
                "model size from config, warm (meta-device build in a running process)",
                fmt_time(base),
                f"{v}: {fmt_time(acc['warm_build_s'])}",
                _x(acc["warm_build_s"], base),
            ],
            [
                "the same, as its CLI pays it (import torch + transformers, first build)",
                fmt_time(base),
                f"{fmt_time(acc['cold_s'])}",
                _x(acc["cold_s"], base),
            ],
            [
                "a fresh process, config to answer (ours: `gpumem estimate --json`)",
                fmt_time(data["cli_process_s"]),
                f"{fmt_time(acc['cold_s'])} (+ interpreter start)",
                _x(acc["cold_s"], data["cli_process_s"]),
            ],
        ]
    out = _table(["operation", "gpumem", "peer", "peer time / ours"], rows, "lrrr") if rows else []
    notes = []
    for name, d in (("llm-analysis", la), ("accelerate", acc)):
        if "missing" in d:
            notes.append(f"* {name}: not measured in this run: {d['missing']}.")
    notes += [
        "* A ratio above 1x means the peer is slower. They do not compute the same thing: llm-analysis "
        "evaluates closed-form formulas (its inference estimates are 20.6 % median off on the measured "
        "grid, `docs/validation.md`); accelerate gives the weights' size only. Ours replays the forward "
        "(inference) or the whole training step op by op.",
        "* Peers run in their own interpreters (`benchmarks/peers_speed.py`) right after our core "
        f"benchmarks, each timed the same way (median, ≥ {data['options']['peer_min_time']:g} s, garbage "
        "collector off).",
    ]
    return [*out, "", *notes]


def _app_section(data: dict) -> list[str]:
    ui, poll, am = data["ui"], data["poll"], data["app_memory"]
    cs, fc = ui["cold_start"], ui["form_change_to_chart"]
    L = ["## App", ""]
    rows = [
        [
            f"cold start to first painted window (`gpumem-gui` from source, offscreen, byte-code cached), "
            f"median of {cs['runs']}",
            f"{cs['first_paint_s_median']:.2f} s",
            "< 1 s",
        ],
        ["the same, to process exit (poller thread stopped)", f"{cs['process_exit_s_median']:.2f} s", "-"],
        [
            f"form change to redrawn chart, median of {fc['changes']}, with the window's debounce "
            "(20 ms for a step)",
            f"{fc['redraw_ms_median_with_debounce']:.1f} ms",
            "< 16 ms",
        ],
        [
            "the same, debounce off (estimate + redraw alone)",
            f"{fc['redraw_ms_median_no_debounce']:.1f} ms (p90 {fc['redraw_ms_p90_no_debounce']:.1f} ms)",
            "< 16 ms",
        ],
        [
            "fit report + sweep on screen after a change (worker thread)",
            f"{fc['fit_and_sweep_on_screen_ms_median_no_debounce']:.0f} ms",
            "-",
        ],
        ["`gpumem estimate --json` as a fresh process", f"{data['cli_process_s']:.2f} s", "-"],
    ]
    fr = data.get("frozen") or {}
    if "missing" in fr:
        rows.append(["frozen binary start to first paint", f"not measured: {fr['missing']}", "< 1 s"])
    elif fr:
        g = fr["frozen_gui"]
        rows.append(
            [
                f"frozen binary start to first paint, median of {fr['runs']}",
                f"{g.get('first_paint_median_s', g['exit_median_s']):.2f} s",
                "< 1 s",
            ]
        )
        rows.append(["frozen `gpumem --version`", f"{fr['frozen_cli_version_s']:.2f} s", "-"])
    L += _table(["measurement", "result", "goal"], rows, "lrr")
    L += ["", "### GPU polling, per GPU (fake backends)", ""]
    nv = poll["nvml_fake_snapshot_s"]
    prow = [
        [f"`NvmlBackend.snapshot()`, {n} GPU{'s' if n != '1' else ''} (3 processes each)", fmt_time(s)]
        for n, s in nv.items()
    ]
    prow += [
        ["per GPU (least-squares slope over 1-8 GPUs)", f"**{fmt_time(poll['nvml_fake_per_gpu_s'])}**"],
        ["A100 in MIG mode, 3 instances", fmt_time(poll["nvml_fake_a100_mig_3_instances_s"])],
    ]
    prow += [
        [f"`FakeBackend.snapshot()`, scenario `{k}`", fmt_time(v)]
        for k, v in poll["fake_backend_snapshot_s"].items()
    ]
    prow.append(
        [
            f"`GpuPoller.poll_once()`, {poll['poll_once_devices']} GPUs (snapshot + Qt signal)",
            fmt_time(poll["poll_once_8xh100_fake_s"]),
        ]
    )
    L += _table(["poll", "median"], prow, "lr")
    L += [
        "",
        "`NvmlBackend` runs over the scripted `pynvml` stand-in of the test suite (`tests/fake_nvml.py`): "
        "this is our code's share of a poll. On real hardware each NVML call adds the driver's own time, "
        "which no fake shows; the poll runs in its own thread, once a second by default.",
        "",
        "### Resident memory",
        "",
    ]
    mrows = [[f"{s['t_s']:.0f} s", _mib(s["rss_bytes"]), s["label"]] for s in am["samples"]]
    L.append(
        f"The real app (`gpumem_gui.app.main`) offscreen, fake GPUs `{am['scenario']}` polled every "
        f"{am['poll_ms']} ms ({1000 / am['poll_ms']:g} Hz, {am['polls_expected']:,} polls; 20x the default "
        "rate, so a per-poll leak shows 20x sooner); RSS from `/proc/self/statm`, sampled from the first "
        "paint. The GPU panel keeps a bounded 5-minute history per GPU, so RSS may rise until it is full, "
        "then must stay flat. Growth over the second half: "
        f"**{am['rss_second_half_growth_bytes'] / MiB:+.1f} MiB**."
    )
    L.append("")
    L += _table(["time after first paint", "RSS", "sample"], mrows, "rrl")
    L.append("")
    return L


def readme_block(data: dict) -> str:
    """The README's speed table: the goal rows, with a pointer to this page."""
    lines = [README_BEGIN, ""]
    lines += _table(["speed goal", "measured", "verdict"], [list(r) for r in goals(data)], "llr")
    lines += [
        "",
        f"Measured by `make bench` on {data['date']} ({data['machine']['nproc']} shared CPUs); details and "
        "the machine in `docs/performance.md`.",
        "",
        README_END,
    ]
    return "\n".join(lines)


def update_readme(path: Path, data: dict) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {README_BEGIN} ... {README_END} block")
    new = pattern.sub(lambda _: readme_block(data), text)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(new)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    ap.add_argument("--readme", type=Path, help="rewrite the speed block of this README")
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    ap.add_argument(
        "--quick", action="store_true", help="tiny measurements: a smoke run, numbers mean nothing"
    )
    ap.add_argument("--no-peers", action="store_true", help="skip llm-analysis and accelerate")
    ap.add_argument("--no-app", action="store_true", help="skip the window, polling and memory measurements")
    ap.add_argument(
        "--soak-seconds", type=float, help="seconds of polling for the memory figure (default 600)"
    )
    args = ap.parse_args(argv)
    kw: dict[str, object] = {"peers": not args.no_peers, "app": not args.no_app}
    if args.soak_seconds is not None:
        kw["soak_s"] = args.soak_seconds
    opts = Options.quick(**kw) if args.quick else Options(**kw)  # type: ignore[arg-type]
    data = collect(opts)
    text = render(data)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    if args.readme:
        update_readme(args.readme, data)
        print(f"updated the speed block of {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
