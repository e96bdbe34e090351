"""``gpumem trace`` against every point of the reference measurements (``make trace-check``).

The reference grid (``groundtruth.json``: made by ``shared/reference/tools/groundtruth.py``, the project's own
measuring script) and ``tests/reference/unsupported/groundtruth.json`` (the same script on configs of model
types the analytic core did not estimate: gpt-oss when measured, Nemotron-H's Mamba-2 hybrid; its README.md
says which) are traced again through the product's own path
(:func:`gpumem_gui.trace.trace`, no cache), in the Python named by ``--python`` (default: this one when it has
torch, else ``$GPUMEM_GT_VENV/bin/python``). The result, point by point, is written to
``tests/reference/trace/groundtruth_check.json`` for ``docs/validation.md``; the exit status is 1 when a point
is off by more than 0.5 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpumem_gui.core import GpumemInputError, load_model  # noqa: E402
from gpumem_gui.core.reference_points import run_for_point  # noqa: E402
from gpumem_gui.trace import in_process_available, trace  # noqa: E402
from validation.validate_report.common import GT_VENV, reference_dir  # noqa: E402

OUT = REPO / "tests" / "reference" / "trace" / "groundtruth_check.json"
UNSUPPORTED = REPO / "tests" / "reference" / "unsupported"
TOLERANCE = 0.005


def _check(config: Path, p: dict[str, Any], python: str | None) -> dict[str, Any]:
    row = {k: p[k] for k in ("model", "mode", "batch", "seq", "attn_implementation")}
    row["reference_peak_bytes"] = p["peak_bytes"]
    t0 = time.perf_counter()
    try:
        model = load_model(str(config), unknown_architecture_ok=True)
        rep = trace(model, run_for_point(p), python=python, use_cache=False)
    except GpumemInputError as e:  # TraceFailure included
        return {**row, "error": str(e)}
    row["trace_peak_bytes"] = rep.result.peak_bytes
    row["relative_error"] = (rep.result.peak_bytes - p["peak_bytes"]) / p["peak_bytes"]
    row["seconds"] = round(time.perf_counter() - t0, 2)
    row["analytic"] = rep.estimate is not None
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=None if in_process_available() else str(GT_VENV / "bin" / "python"))
    args = ap.parse_args(argv)
    sets = [
        (reference_dir() / "groundtruth.json", reference_dir() / "configs"),
        (UNSUPPORTED / "groundtruth.json", UNSUPPORTED / "configs"),
    ]
    rows = []
    for grid_file, configs in sets:
        for p in json.loads(grid_file.read_text())["grid"]:
            row = _check(configs / f"{p['model']}.json", p, args.python)
            rows.append(row)
            err = row.get("relative_error")
            print(
                f"{p['model']} {p['mode']} b{p['batch']} s{p['seq']} {p['attn_implementation']}: "
                + (f"{err * 100:+.4f} %" if err is not None else row.get("error", "?")),
                file=sys.stderr,
            )
    doc = {
        "about": "gpumem trace (validation/trace_groundtruth.py) against every reference measurement point",
        "tolerance": TOLERANCE,
        "points": rows,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    bad = [r for r in rows if "error" in r or abs(r["relative_error"]) > TOLERANCE]
    print(f"{len(rows) - len(bad)} of {len(rows)} points within {TOLERANCE:.1%} -> {OUT}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
