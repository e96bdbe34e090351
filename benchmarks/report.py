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
``--soak`` adds issue 18's soak (``soak_flip.py``: 30 minutes at 20 Hz x 8 fake GPUs with a local target whose
verdict flips) and records it in ``benchmarks/results/soak_flip.json``; runs without it show that record.

The measuring is in ``report_measure.py``, the goal rows in ``report_goals.py`` and the page in
``report_render.py``; this script ties them together.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.report_goals import (  # noqa: E402
    GOAL_COLD_START_S,
    GOAL_META_X,
    GOAL_PEER_X,
    GOAL_REDRAW_MS,
    SWEEP,
    TRAIN_UNCACHED,
    MiB,
    fmt_time,
    goals,
)
from benchmarks.report_measure import Options, cli_process, collect, frozen_start  # noqa: E402
from benchmarks.report_render import render, table  # noqa: E402

README_BEGIN, README_END = "<!-- perf:begin -->", "<!-- perf:end -->"

__all__ = [
    "GOAL_COLD_START_S",
    "GOAL_META_X",
    "GOAL_PEER_X",
    "GOAL_REDRAW_MS",
    "README_BEGIN",
    "README_END",
    "REPO",
    "SWEEP",
    "TRAIN_UNCACHED",
    "MiB",
    "Options",
    "cli_process",
    "collect",
    "fmt_time",
    "frozen_start",
    "goals",
    "main",
    "readme_block",
    "render",
    "update_readme",
]


def readme_block(data: dict) -> str:
    """The README's speed table: the goal rows, with a pointer to this page."""
    lines = [README_BEGIN, ""]
    lines += table(["speed goal", "measured", "verdict"], [list(r) for r in goals(data)], "llr")
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
    ap.add_argument(
        "--soak",
        action="store_true",
        help="also run the 30-minute soak with a flipping local target (soak_flip.py; issue 18); without "
        "it the page shows the last recorded one",
    )
    ap.add_argument("--soak-flip-seconds", type=float, help="seconds of that soak (default 1800)")
    args = ap.parse_args(argv)
    kw: dict[str, object] = {"peers": not args.no_peers, "app": not args.no_app, "flip_soak": args.soak}
    if args.soak_seconds is not None:
        kw["soak_s"] = args.soak_seconds
    if args.soak_flip_seconds is not None:
        kw["flip_soak_s"] = args.soak_flip_seconds
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
