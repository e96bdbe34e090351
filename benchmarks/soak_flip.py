"""Soak: does the window grow while a local GPU target's verdict flips between "fits" and "misses"?

Issue 18 found RSS rising ~13-20 KiB/s (levelling off near +18 MiB) when a local target's verdict flipped:
every flip made a new ``QIcon`` for the banner, whose pixmap landed in Qt's global ``QPixmapCache`` under a
new key (C++ memory, invisible to tracemalloc). This starts the real app (``gpumem_gui.app.main``) offscreen
with a throwaway ``HOME`` against a generated fake scenario: 8 H100 80GB whose used memory alternates between
2 GiB and 73 GiB every ``--half-steps`` polls (each GPU shifted by one step), polled every ``--poll-ms``
(default 50 ms: 20 Hz). The first usable GPU becomes the target, so the default plan (Llama-3.1-8B, ~16.5 GiB)
fits and misses by turns; every flip recomputes, redraws the banner, the charts and the cards, and reruns the
fit report and the sweep in the worker. RSS (``/proc/self/statm``) is sampled from the first paint on, and the
number of banner flips is counted (a soak whose verdict never flipped would prove nothing).

    .venv/bin/python benchmarks/soak_flip.py --seconds 1800 [--every 60] [--json] [--repo DIR]

``--drift`` instead gives each GPU a used memory that differs on every reading (97 values ~7 MiB apart, well
below the plan's need) so the verdict never flips but the local target is re-estimated against new free memory
on every drawn reading (issue 33 item 4: the README said such re-estimates grew the process ~10 MiB an hour).

``--repo`` runs another source tree of gpumem with this interpreter (a before/after comparison). The goal
(issue 18): under 1 MiB of growth over the second half. ``benchmarks/report.py --soak`` runs it for
``docs/performance.md``; the test suite never does (``tests/test_rough_ui.py`` counts pixmap-cache keys
instead).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.app_memory import app_samples  # noqa: E402  (the one app wrapper and RSS sampler)

MiB = 1 << 20
GOAL_GROWTH_BYTES = 1 * MiB  # issue 18: "under 1 MiB growth in the second half"
H100_TOTAL_MIB = 81559  # H100 80GB HBM3 as nvidia-smi reports it (resources/fake_gpus/8xh100_busy.json)
LOW_MIB, HIGH_MIB = 2048, 75000  # free ~77 GiB (fits) / ~6 GiB (misses a ~16.5 GiB plan)


def flip_scenario(half_steps: int, gpus: int = 8) -> dict:
    """8 H100s whose used memory alternates low/high every ``half_steps`` polls, each GPU one step later."""
    cycle = [LOW_MIB] * half_steps + [HIGH_MIB] * half_steps
    return {
        "version": 1,
        "description": "issue 18 soak: free memory alternating so a local target's verdict flips",
        "at_end": "cycle",
        "gpus": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "total_mib": H100_TOTAL_MIB,
                "reserved_mib": 0,
                "used_mib": cycle[i % len(cycle) :] + cycle[: i % len(cycle)],
                "utilization_percent": [50, 90],
                "processes": [{"pid": 1000 + i, "name": "python", "used_mib": 1024}],
            }
            for i in range(gpus)
        ],
    }


def drift_scenario(gpus: int = 8, values: int = 97) -> dict:
    """8 H100s whose used memory differs on every reading (``values`` steps 7 MiB apart from 2 GiB, each GPU
    shifted by one step): free memory changes every poll, the verdict of a ~16.5 GiB plan never does."""
    cycle = [LOW_MIB + 7 * i for i in range(values)]
    scenario = flip_scenario(1, gpus)
    scenario["description"] = "issue 33 soak: free memory changing on every reading, the verdict steady"
    for i, gpu in enumerate(scenario["gpus"]):
        gpu["used_mib"] = cycle[i:] + cycle[:i]
    return scenario


def run(
    seconds: float, every: float, poll_ms: int, half_steps: int, repo: Path = REPO, drift: bool = False
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="gpumem-soakflip-") as tmp:
        scenario = Path(tmp) / "flip.json"
        scenario.write_text(json.dumps(drift_scenario() if drift else flip_scenario(half_steps)))
        app_args = ["--fake-gpus", str(scenario), "--poll-ms", str(poll_ms)]
        samples, states = app_samples(seconds, every, app_args, repo)
    return summarize(samples, seconds, poll_ms, half_steps, states, drift)


def summarize(
    samples: list[dict], seconds: float, poll_ms: int, half_steps: int, states: list[str], drift: bool = False
) -> dict[str, object]:
    """The figures the page shows: growth over the second half, and the rate over the whole run."""
    half = [s for s in samples if s["t_s"] >= seconds / 2]
    first, last = samples[0], samples[-1]
    growth = half[-1]["rss_bytes"] - half[0]["rss_bytes"] if len(half) > 1 else 0
    span = max(last["t_s"] - first["t_s"], 1e-9)
    return {
        "seconds": seconds,
        "poll_ms": poll_ms,
        "gpus": 8,
        "half_steps": None if drift else half_steps,
        "drift": drift,
        "flips": last["flips"],
        "banner_states": states,
        "rss_first_paint_bytes": first["rss_bytes"],
        "rss_end_bytes": last["rss_bytes"],
        "rss_max_bytes": max(s["rss_bytes"] for s in samples),
        "rss_second_half_growth_bytes": growth,
        "rss_rate_bytes_per_s": (last["rss_bytes"] - first["rss_bytes"]) / span,
        "goal_bytes": GOAL_GROWTH_BYTES,
        # a flip soak whose verdict never flipped proves nothing; a drift soak must not flip
        "met": growth < GOAL_GROWTH_BYTES and (last["flips"] == 0 if drift else last["flips"] > 0),
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1800.0, help="seconds after first paint (default 1800)")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between RSS samples (default 60)")
    ap.add_argument("--poll-ms", type=int, default=50, help="GPU poll interval (default 50 ms: 20 Hz)")
    ap.add_argument("--half-steps", type=int, default=10, help="polls per half cycle (default 10: 0.5 s)")
    ap.add_argument("--drift", action="store_true", help="free memory changes every reading, no flips")
    ap.add_argument("--repo", type=Path, default=REPO, help="the gpumem source tree to run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.seconds, min(args.every, args.seconds), args.poll_ms, args.half_steps, args.repo, args.drift)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    for s in r["samples"]:  # type: ignore[union-attr]
        print(f"{s['t_s']:7.1f} s  {s['rss_bytes'] / MiB:8.1f} MiB  {s['flips']:6d} flips  {s['label']}")
    print(
        f"second half: {r['rss_second_half_growth_bytes'] / MiB:+.2f} MiB (goal < 1 MiB); "  # type: ignore[operator]
        f"whole run {r['rss_rate_bytes_per_s'] / 1024:+.2f} KiB/s; {r['flips']} flips"  # type: ignore[operator]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
