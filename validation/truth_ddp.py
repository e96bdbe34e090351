"""Ground truth for DDP and torch ZeRO-1 per rank: ``gpumem trace`` (PyTorch's MemTracker on one rank of a
fake process group, the second optimizer step) over a grid, written to
``tests/reference/distributed/ddp.json``.

The grid: three models (Qwen2.5-0.5B, Llama-3.2-1B, Qwen3-0.6B) under DDP at dp 2/4/8, amp-bf16 / bf16 / fp32,
``gradient_as_bucket_view`` on and off, ``bucket_cap_mb`` 25 (torch's default, 1 MiB first bucket) and 100,
gradient checkpointing and LoRA on one point each, and ``ZeroRedundancyOptimizer`` (``--zero 1 --zero-impl
torch``) at dp 2/4/8; the trace measures the rank holding the most parameters (see
``gpumem_trace_worker/distributed.py``). ``tests/test_truth_ddp.py`` checks the estimate against every point.

    .venv/bin/python validation/truth_ddp.py            # ~10 minutes on a laptop CPU
    .venv/bin/python validation/truth_ddp.py --only Qwen  # a subset (the file keeps the other points)
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

from gpumem_gui.core import load_model, make_training_run  # noqa: E402
from gpumem_gui.trace import trace  # noqa: E402

OUT = REPO / "tests" / "reference" / "distributed" / "ddp.json"
CONFIGS = REPO / "tests" / "reference" / "configs"
# model -> the workload of its points (small enough for a CPU trace in seconds)
MODELS = {
    "Qwen__Qwen2.5-0.5B": {"batch": 2, "seq": 512},
    "meta-llama__Llama-3.2-1B": {"batch": 1, "seq": 512},
    "Qwen__Qwen3-0.6B": {"batch": 2, "seq": 512},
}


def grid() -> list[tuple[str, dict[str, Any]]]:
    """(model, run fields) of every point."""
    out: list[tuple[str, dict[str, Any]]] = []
    for model, work in MODELS.items():
        runs: list[dict[str, Any]] = [{"dp": 4, "precision": p} for p in ("amp-bf16", "bf16", "fp32")]
        runs += [{"dp": dp, "precision": "amp-bf16"} for dp in (2, 8)]
        runs += [{"dp": 4, "precision": p, "bucket_view": True} for p in ("amp-bf16", "bf16")]
        runs.append({"dp": 4, "precision": "amp-bf16", "bucket_cap_mb": 100.0})
        runs.append({"dp": 4, "precision": "bf16", "bucket_cap_mb": 100.0, "bucket_view": True})
        runs += [{"dp": dp, "precision": "amp-bf16", "zero": 1, "zero_impl": "torch"} for dp in (2, 4, 8)]
        out += [(model, {**work, **r}) for r in runs]
    first = next(iter(MODELS))
    extra = MODELS[first]
    out.append((first, {**extra, "dp": 4, "precision": "amp-bf16", "grad_ckpt": True}))
    out.append((first, {**extra, "dp": 4, "precision": "bf16", "zero": 1, "zero_impl": "torch"}))
    out.append((first, {**extra, "dp": 4, "precision": "fp32", "grad_ckpt": True, "bucket_view": True}))
    out.append((first, {**extra, "dp": 4, "precision": "amp-bf16", "method": "lora", "lora_rank": 16}))
    return out


def key(model: str, run: dict[str, Any]) -> str:
    return model + " " + " ".join(f"{k}={run[k]}" for k in sorted(run))


def measure(model: str, fields: dict[str, Any]) -> dict[str, Any]:
    run = make_training_run(**fields)
    rep = trace(load_model(str(CONFIGS / f"{model}.json")), run, use_cache=False)
    res = rep.result
    return {
        "model": model,
        "run": fields,
        "versions": res.versions,
        "world_size": res.world_size,
        "notes": list(res.notes),
        "trainable_params": res.trainable_params,
        "phases": res.phases,
        "estimate_at_record": {p.phase: p.estimated_bytes for p in rep.phases},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="trace only the points whose key contains this text")
    args = ap.parse_args(argv)
    old = json.loads(OUT.read_text())["points"] if OUT.exists() else []
    kept = {key(p["model"], p["run"]): p for p in old}
    points = []
    for model, fields in grid():
        k = key(model, fields)
        if args.only and args.only not in k:
            if k in kept:
                points.append(kept[k])
            continue
        t0 = time.perf_counter()
        p = measure(model, fields)
        points.append(p)
        peak = max(p["phases"], key=lambda ph: p["phases"][ph]["Total"])
        est, got = p["estimate_at_record"][peak], p["phases"][peak]["Total"]
        print(f"{k}: {(est - got) / got * 100:+.2f} % ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "about": "DDP / torch ZeRO-1 per rank traced by PyTorch MemTracker under a fake process group "
        "(validation/truth_ddp.py); phases: tracker categories at each phase's peak of the second step",
        "points": points,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(points)} points -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
