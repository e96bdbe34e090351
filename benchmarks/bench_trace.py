"""Trace mode's cost beside the analytic estimate's: the same answer, thousands of times cheaper where the
core knows the model (issue 13's speed goals are ``report_goals.TRACE_GOALS``, matched to these rows by
name).

Prints one JSON object (``--json``) or a table. Needs torch and transformers in this Python (the trace extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_core, bench_training
from gpumem_gui.core import estimate_any, load_model, make_run, make_training_run
from gpumem_gui.trace import in_process_available, trace

CASES = (
    ("8B inference point (in process)", "Llama-3.1-8B", lambda: make_run(seq=4096), None),
    (
        "8B inference point with decode (in process)",  # + a cache built as generate() builds it: 4 forwards
        "Llama-3.1-8B",
        lambda: make_run(seq=4096, new_tokens=256),
        None,
    ),
    ("8B training step (in process)", "Llama-3.1-8B", lambda: make_training_run(seq=2048), None),
    ("30B MoE inference point (in process)", "Qwen3-30B-A3B", lambda: make_run(seq=4096), None),
    ("70B inference point (in process)", "Llama-3.1-70B-Instruct", lambda: make_run(seq=4096), None),
    (
        "8B inference point (fresh subprocess)",
        "Llama-3.1-8B",
        lambda: make_run(seq=4096),
        "sub",
    ),
)


def _median(fn, runs: int) -> float:
    """Median of ``runs`` calls (a trace takes seconds: no warm-up call as bench_core.measure makes)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _estimate_seconds(spec: Any, run: Any) -> float:
    """The analytic estimate of the same run, as a fresh question costs it (a training step's replay is
    memoised per run, so that cache is cleared before every call)."""

    def fresh() -> object:
        bench_training.clear_training_cache()
        return estimate_any(spec, run)

    return bench_core.measure(fresh, min_time=0.2)[0]


def measure(runs: int) -> dict:
    if not in_process_available():
        return {"missing": "no torch/transformers in this Python (make install-trace)"}
    trace(
        load_model("Llama-3.2-1B"), make_run(seq=64), use_cache=False
    )  # imports torch and transformers once
    rows = []
    for name, model_id, make, how in CASES:
        model, run = load_model(model_id), make()
        python = sys.executable if how == "sub" else None
        s = _median(lambda m=model, r=run, p=python: trace(m, r, python=p, use_cache=False), runs)
        est = _estimate_seconds(model.spec, run)
        rows.append({"name": name, "trace_s": s, "estimate_s": est, "ratio": s / est if est else None})
    model, run = load_model("Llama-3.1-8B"), make_run(seq=4096)
    trace(model, run)  # fills the cache
    cached = _median(lambda: trace(model, run), 20)
    rows.append({"name": "8B inference point (cached)", "trace_s": cached, "estimate_s": None, "ratio": None})
    return {"rows": rows, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    data = measure(args.runs)
    if args.json:
        print(json.dumps(data))
    elif "missing" in data:
        print(data["missing"])
    else:
        for r in data["rows"]:
            ratio = f"{r['ratio']:,.0f}x" if r["ratio"] else ""
            print(f"{r['name']:40} {r['trace_s'] * 1e3:10.1f} ms  {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
