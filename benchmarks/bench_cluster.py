"""The cluster view at scale: 1,000 GPUs on 125 hosts behind a real Prometheus (issue 17's goals).

Starts the Debian package's ``prometheus`` on loopback scraping a synthetic cluster built from the recorded
dcgm-exporter label sets (``tests.prometheus_harness.synthetic_cluster``: 125 hosts x 8 GPUs, every second),
then times, each as the median of ``--rounds`` runs:

* ``snapshot``: the backend's six instant queries and the snapshot they become (``PrometheusBackend``);
* ``fit``: ``cluster_fit`` for every placement of a plan (Llama-3.1-8B on one GPU: every GPU is a candidate;
  Llama-3.1-70B at TP 8: one whole host per placement; the 8B trained with DP 16: ranks over hosts);
* ``total``: query + snapshot + fit, the goal being under 1 s;
* ``panel``: the window's cluster panel taking one new snapshot (GUI-thread time, offscreen), goal 50 ms.

    .venv/bin/python benchmarks/bench_cluster.py [--rounds 5] [--hosts 125] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.prometheus_harness: the real Prometheus the test suite uses

from gpumem_gui.core import cluster_fit, cluster_summary, load_model, make_run, make_training_run  # noqa: E402
from gpumem_gui.hardware import PrometheusBackend, make_prometheus_config  # noqa: E402
from gpumem_gui.hardware.cluster import cluster_gpus  # noqa: E402
from tests.prometheus_harness import ExpositionServer, PrometheusServer, synthetic_cluster  # noqa: E402

GOAL_TOTAL_S = 1.0  # issue 17: query + snapshot + fit for every placement, 1,000 GPUs on 125 hosts
GOAL_PANEL_S = 0.050  # issue 17: the panel's update, GUI time


def _median(fn: Callable[[], object], rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _plans() -> list[tuple[str, object, object]]:
    m8 = load_model("meta-llama/Llama-3.1-8B")
    m70 = load_model("meta-llama/Llama-3.1-70B-Instruct")
    return [
        ("Llama-3.1-8B inference, 1 GPU", m8, make_run(batch=8, seq=4096)),
        ("Llama-3.1-70B inference, TP 8", m70, make_run(batch=8, seq=8192, tp=8)),
        ("Llama-3.1-8B training, DP 16 (ZeRO-3)", m8, make_training_run(dp=16, zero=3, seq=4096)),
    ]


def _panel_update(snaps: list[object], rounds: int) -> float | None:
    """GUI time of the cluster panel taking a new snapshot; None when the panel is not importable."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from PySide6.QtWidgets import QApplication

        from gpumem_gui.ui.cluster_view import ClusterView
    except ImportError:
        return None
    from gpumem_gui.core import DEFAULT_MARGIN_BYTES, GpuTarget, SizeUnit, estimate_any, verdicts

    est = estimate_any(load_model("meta-llama/Llama-3.1-8B").spec, make_run(batch=8, seq=4096), None)

    def evaluator(d, available):  # the window's per-card verdict: the plan's GPU 0 against this card
        target = GpuTarget(name=d.name, capacity_bytes=d.total_bytes or 1, free_bytes=(available,))
        return verdicts(est, target, DEFAULT_MARGIN_BYTES)[0]

    app = QApplication.instance() or QApplication([])
    panel = ClusterView()
    panel.sync(evaluator, "free", SizeUnit.GIB)
    panel.resize(420, 900)
    panel.show()
    panel.show_snapshot(snaps[0])
    app.processEvents()
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        panel.show_snapshot(snaps[(i + 1) % len(snaps)])
        app.processEvents()
        times.append(time.perf_counter() - t0)
    panel.close()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=125)
    ap.add_argument("--gpus-per-host", type=int, default=8)
    ap.add_argument(
        "--json", action="store_true", help="print the numbers as JSON only (benchmarks/report.py)"
    )
    args = ap.parse_args(argv)

    cluster = synthetic_cluster(args.hosts, args.gpus_per_host)
    rows: dict[str, object] = {"hosts": args.hosts, "gpus": args.hosts * args.gpus_per_host}
    with ExpositionServer(cluster) as exposition, PrometheusServer(exposition) as prom:
        prom.wait_scraped(timeout=60)
        backend = PrometheusBackend(make_prometheus_config(url=prom.url))
        snap_s, snap = _median(backend.snapshot, args.rounds)
        assert snap.available and len(snap.devices) == rows["gpus"], snap.unavailable_reason  # type: ignore[attr-defined]
        rows["snapshot_s"] = snap_s
        gpus = cluster_gpus(snap)  # type: ignore[arg-type]
        fits = {}
        for label, m, run in _plans():
            fit_s, cf = _median(lambda m=m, run=run: cluster_fit(m.spec, run, gpus), args.rounds)
            fits[label] = {"fit_s": fit_s, "total_s": snap_s + fit_s, "summary": cluster_summary(cf)}  # type: ignore[arg-type]
        rows["fits"] = fits
        snaps = [snap, *(backend.snapshot() for _ in range(2))]
        backend.close()
    rows["panel_s"] = _panel_update(snaps, args.rounds * 4)

    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"cluster: {rows['gpus']} GPUs on {rows['hosts']} hosts, real Prometheus on loopback")
    print(f"  snapshot (6 queries + parse):   {snap_s * 1e3:8.1f} ms")
    for label, f in fits.items():
        ok = "meets" if f["total_s"] < GOAL_TOTAL_S else "MISSES"
        print(f"  fit {label:38s} {f['fit_s'] * 1e3:8.1f} ms; total {f['total_s'] * 1e3:7.1f} ms ({ok} 1 s)")
        print(f"      {f['summary']}")
    panel = rows["panel_s"]
    if panel is None:
        print("  panel update: not measured (no cluster panel importable)")
    else:
        ok = "meets" if panel < GOAL_PANEL_S else "MISSES"
        print(f"  panel update (GUI thread):      {panel * 1e3:8.1f} ms ({ok} 50 ms)")  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
