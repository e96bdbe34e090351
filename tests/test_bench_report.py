"""benchmarks/report.py (``make bench``) keeps working: a tiny run of every measurement, and its verdicts.

Nothing here asserts a speed: the smoke run's numbers mean nothing (``--quick``); the tests check that each
part runs, that the page has every section and that a goal's verdict follows from its numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import bench_core, report

MiB = 1 << 20


def fake_data(base_s: float, sweep_s: float, la: dict | None, acc: dict | None, growth: int = 0) -> dict:
    core = [
        {"name": bench_core.BASELINE, "median_s": base_s, "runs": 100, "note": ""},
        {"name": report.SWEEP, "median_s": sweep_s, "runs": 5, "note": ""},
        {"name": report.TRAIN_UNCACHED, "median_s": 0.05, "runs": 5, "note": ""},
    ]
    samples = [
        {"label": "first-paint", "t_s": 0.0, "rss_bytes": 100 * MiB},
        {"label": "tick", "t_s": 300.0, "rss_bytes": 110 * MiB},
        {"label": "end", "t_s": 600.0, "rss_bytes": 110 * MiB + growth},
    ]
    return {
        "date": "2026-01-01 00:00 UTC",
        "commit": "abc1234",
        "dirty": False,
        "machine": {"nproc": "2", "cpu": "test CPU", "python": "CPython 3.11", "platform": "Linux"},
        "load_start": (0.5, 0.5, 0.5),
        "load_end": (0.7, 0.5, 0.5),
        "options": report.Options().__dict__,
        "core": core,
        "profile": {"rows": [("core.py:1(f)", 50.0, 90.0, 3)], "per_call_s": 1e-3},
        "llm_analysis": la or {"missing": "no venv"},
        "accelerate": acc or {"missing": "no venv"},
        "cli_process_s": 0.8,
        "ui": {
            "cold_start": {"runs": 5, "first_paint_s_median": 0.9, "process_exit_s_median": 1.2},
            "form_change_to_chart": {
                "changes": 50,
                "redraw_ms_median_with_debounce": 130.0,
                "redraw_ms_median_no_debounce": 20.0,
                "redraw_ms_p90_no_debounce": 25.0,
                "fit_and_sweep_on_screen_ms_median_no_debounce": 150.0,
            },
        },
        "poll": {
            "nvml_fake_snapshot_s": {"1": 1e-4, "8": 5e-4},
            "nvml_fake_per_gpu_s": 5e-5,
            "nvml_fake_a100_mig_3_instances_s": 2e-4,
            "fake_backend_snapshot_s": {"8xh100_busy": 4e-4},
            "poll_once_8xh100_fake_s": 6e-4,
            "poll_once_devices": 8,
        },
        "app_memory": {
            "seconds": 600.0,
            "poll_ms": 50,
            "scenario": "8xh100_busy",
            "polls_expected": 12000,
            "rss_first_paint_bytes": 100 * MiB,
            "rss_end_bytes": 110 * MiB + growth,
            "rss_second_half_growth_bytes": growth,
            "samples": samples,
        },
        "frozen": {"missing": "no archive"},
    }


def verdicts(data: dict) -> dict[str, str]:
    return {goal: verdict for goal, _, verdict in report.goals(data)}


def test_verdicts_follow_the_numbers() -> None:
    la = {"version": "0.2.2", "infer_s": 400e-6, "train_s": 300e-6, "sweep_s": 0.1}
    acc = {"version": "1", "transformers": "5", "torch": "2", "warm_build_s": 0.3, "cold_s": 8.0}
    fast = verdicts(fake_data(30e-6, 15e-3, la, acc))
    assert fast["one inference estimate < 50 µs"] == "met"
    assert fast["256-point sweep < 20 ms"] == "met"
    assert fast["≥ 10x faster than llm-analysis, inference estimate"] == "met"  # 400 / 30 = 13x
    assert fast["≥ 10,000x faster than building a meta model (warm, in one process)"] == "met"
    assert fast["cold start to first painted window < 1 s"] == "met"
    assert fast["form change to redrawn chart < 16 ms"] == "**missed**"
    slow = verdicts(fake_data(300e-6, 90e-3, la, acc))
    assert slow["one inference estimate < 50 µs"] == "**missed**"
    assert slow["256-point sweep < 20 ms"] == "**missed**"
    assert slow["≥ 10x faster than llm-analysis, inference estimate"] == "**missed**"
    assert slow["≥ 10,000x faster than building a meta model (warm, in one process)"] == "**missed**"
    assert slow["≥ 10,000x faster than a meta model as its CLI pays it (imports + first build)"] == "met"
    leaking = verdicts(fake_data(30e-6, 15e-3, la, acc, growth=20 * MiB))
    assert leaking["resident memory bounded over 10 min of polling"] == "**growing**"


def test_missing_peers_are_said_not_hidden() -> None:
    data = fake_data(300e-6, 90e-3, None, None)
    text = report.render(data)
    assert "not measured: no venv" in text
    assert "llm-analysis: not measured in this run" in text
    assert "| peer time / ours |" not in text  # no empty peer table


def test_training_ratio_says_we_are_slower() -> None:
    la = {"version": "0.2.2", "infer_s": 400e-6, "train_s": 500e-6, "sweep_s": 0.1}
    text = report.render(fake_data(300e-6, 90e-3, la, None))
    assert "ours 100x slower" in text  # 0.05 s vs 500 µs


def test_readme_block_is_replaced_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{report.README_BEGIN}\nOLD-CONTENT\n{report.README_END}\n\nafter\n")
    data = fake_data(300e-6, 90e-3, None, None)
    report.update_readme(readme, data)
    once = readme.read_text()
    assert "OLD-CONTENT" not in once and "before" in once and "after" in once
    assert "| one inference estimate < 50 µs | 300.0 µs" in once
    report.update_readme(readme, data)
    assert readme.read_text() == once
    bare = tmp_path / "bare.md"
    bare.write_text("no block\n")
    with pytest.raises(SystemExit):
        report.update_readme(bare, data)


def test_the_real_readme_has_the_block() -> None:
    text = (REPO / "README.md").read_text()
    assert report.README_BEGIN in text and report.README_END in text


def test_quick_run_measures_everything(tmp_path: Path) -> None:
    out, raw = tmp_path / "perf.md", tmp_path / "perf.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(REPO / "benchmarks" / "report.py"), "--quick", "--no-peers"),
            *("--soak-seconds", "2", "--out", str(out), "--json", str(raw)),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(raw.read_text())
    names = {r["name"] for r in data["core"]}
    assert {bench_core.BASELINE, report.SWEEP, report.TRAIN_UNCACHED} <= names
    assert all(r["median_s"] > 0 for r in data["core"])
    assert data["ui"]["cold_start"]["first_paint_s_median"] > 0
    assert data["ui"]["form_change_to_chart"]["redraw_ms_median_no_debounce"] > 0
    assert data["poll"]["nvml_fake_per_gpu_s"] > 0 and data["poll"]["poll_once_devices"] == 8
    assert data["app_memory"]["rss_first_paint_bytes"] > 0
    assert data["app_memory"]["samples"][-1]["label"] == "end"
    text = out.read_text()
    for heading in ("## Machine", "## Goals", "## Core", "### Side by side", "## App", "### Resident memory"):
        assert heading in text
