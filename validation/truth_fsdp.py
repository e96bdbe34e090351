"""FSDP ground truth: ``gpumem trace`` of FSDP2 runs, stored in ``tests/reference/distributed/fsdp.json``.

Every point is traced through the product's own path (:func:`gpumem_gui.trace.trace`, no cache): the real
transformers model under FakeTensorMode, ``fully_shard`` on every decoder layer and the root on torch's fake
process group, counted on rank 0 by PyTorch's ``FSDPMemTracker`` (second iteration: steady state). The grid
spans models (tied and untied heads, Gemma-2's 256k vocabulary, Llama-3-8B's 4.2 GB root unit), precisions
(mp-bf16 = ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, amp-bf16 = fp32 + autocast, pure
bf16), ``reshard_after_forward`` True / False / an int, HSDP, gradient checkpointing, world sizes 2/4/8 and
LoRA, and the embedding and the head sharded apart (``fsdp_units``). Each point keeps the tracker's snapshot
at every phase's peak (bytes by tracker category), the environment's versions, the seconds it took and, for
the record, the estimate of the code that wrote the file (``--refresh-estimates`` recomputes it for the stored
points without tracing again). ``tests/test_truth_fsdp.py`` checks the current estimate against every stored
point.

Run: ``.venv/bin/python validation/truth_fsdp.py [--jobs 2] [--only SUBSTRING]`` (about 15 minutes on 2 CPUs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "tests" / "reference" / "distributed" / "fsdp.json"
CONFIGS = REPO / "tests" / "reference" / "configs"

QWEN = "Qwen__Qwen2.5-0.5B"
LLAMA1B = "meta-llama__Llama-3.2-1B"
TINY = "TinyLlama__TinyLlama-1.1B-Chat-v1.0"
GEMMA = "google__gemma-2-2b"
LLAMA8B = "meta-llama__Meta-Llama-3-8B"


def _p(model: str, **run: Any) -> dict[str, Any]:
    return {"model": model, "run": {"fsdp": "full_shard", **run}}


# (model, run fields beside the defaults): every point names what it covers
GRID: list[dict[str, Any]] = [
    _p(QWEN, dp=4, batch=2, seq=512, precision="amp-bf16"),
    _p(QWEN, dp=4, batch=2, seq=512, precision="mp-bf16"),
    _p(QWEN, dp=4, batch=2, seq=512, precision="bf16"),
    _p(QWEN, dp=4, batch=2, seq=512, precision="mp-bf16", fsdp="shard_grad_op"),
    _p(QWEN, dp=8, batch=2, seq=512, precision="mp-bf16", reshard_size=2),
    _p(QWEN, dp=2, batch=2, seq=512, precision="mp-bf16", grad_ckpt=True),
    _p(QWEN, dp=2, batch=2, seq=512, precision="amp-bf16", fsdp="shard_grad_op", grad_ckpt=True),
    _p(QWEN, dp=8, batch=2, seq=512, precision="mp-bf16", fsdp="hybrid_shard", gpus_per_node=4),
    _p(QWEN, dp=4, batch=2, seq=512, precision="amp-bf16", method="lora"),
    _p(QWEN, dp=4, batch=2, seq=512, precision="mp-bf16", method="lora", grad_ckpt=True),
    _p(LLAMA1B, dp=8, batch=1, seq=1024, precision="mp-bf16", grad_ckpt=True),
    _p(LLAMA1B, dp=4, batch=1, seq=1024, precision="amp-bf16"),
    _p(LLAMA1B, dp=8, batch=1, seq=512, precision="bf16", fsdp="shard_grad_op"),
    _p(LLAMA1B, dp=8, batch=1, seq=512, precision="mp-bf16", reshard_size=4, grad_ckpt=True),
    _p(TINY, dp=4, batch=1, seq=512, precision="mp-bf16", grad_ckpt=True),
    _p(TINY, dp=2, batch=1, seq=512, precision="amp-bf16"),
    _p(TINY, dp=8, batch=1, seq=512, precision="bf16", grad_ckpt=True),
    # the embedding and the head as units of their own (torchtune custom_sharded_layers)
    _p(TINY, dp=4, batch=1, seq=512, precision="amp-bf16", fsdp_units="embedding+head"),
    _p(TINY, dp=4, batch=1, seq=512, precision="mp-bf16", grad_ckpt=True, fsdp_units="embedding"),
    _p(GEMMA, dp=4, batch=1, seq=512, precision="mp-bf16", grad_ckpt=True),
    _p(GEMMA, dp=8, batch=1, seq=256, precision="amp-bf16"),
    _p(GEMMA, dp=4, batch=1, seq=512, precision="bf16", fsdp="shard_grad_op", grad_ckpt=True),
    _p(LLAMA8B, dp=8, batch=1, seq=256, precision="mp-bf16", grad_ckpt=True),
    _p(LLAMA8B, dp=8, batch=1, seq=256, precision="amp-bf16", grad_ckpt=True),
]


def point_id(p: dict[str, Any]) -> str:
    return p["model"] + " " + " ".join(f"{k}={v}" for k, v in sorted(p["run"].items()))


def _estimate(p: dict[str, Any]) -> dict[str, int]:
    """The estimate's phase peaks for the rank the trace measures (as ``gpumem trace`` compares them)."""
    from gpumem_gui.core import TrainingRun, load_model
    from gpumem_gui.core.fit.tracked import tracked_breakdown
    from gpumem_gui.core.training import estimate_training

    spec = load_model(str(CONFIGS / f"{p['model']}.json")).spec
    assert spec is not None
    run = TrainingRun(**p["run"])
    est = tracked_breakdown(spec, run, estimate_training(spec, run))
    return {ph: sum(v.values()) for ph, v in est.items()}


def _trace_point(p: dict[str, Any]) -> dict[str, Any]:
    from gpumem_gui.core import TrainingRun, load_model
    from gpumem_gui.trace import trace

    model = load_model(str(CONFIGS / f"{p['model']}.json"))
    t0 = time.perf_counter()
    rep = trace(model, TrainingRun(**p["run"]), use_cache=False)
    seconds = round(time.perf_counter() - t0, 2)
    r = rep.result
    return {
        "id": point_id(p),
        "model": p["model"],
        "run": p["run"],
        "versions": r.versions,
        "seconds": seconds,
        "world_size": r.world_size,
        "notes": list(r.notes),
        "traced": r.phases,
        "estimate": _estimate(p),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="points traced at once (one process each)")
    ap.add_argument("--only", default="", help="trace only the points whose id contains this")
    ap.add_argument("--refresh-estimates", action="store_true", help="recompute the stored estimates only")
    args = ap.parse_args(argv)
    todo = [p for p in GRID if args.only in point_id(p)]
    old = {q["id"]: q for q in json.loads(OUT.read_text())["points"]} if OUT.exists() else {}
    if args.refresh_estimates:
        done = [{**old[point_id(p)], "estimate": _estimate(p)} for p in todo if point_id(p) in old]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs, max_tasks_per_child=1) as ex:
            done = list(ex.map(_trace_point, todo))
    for q in done:
        old[q["id"]] = q
        peak = max(q["traced"], key=lambda k: q["traced"][k]["Total"])
        t, e = q["traced"][peak]["Total"], q["estimate"][peak]
        print(f"{q['id']}: traced {t:,} estimate {e:,} ({(e - t) / t * 100:+.3f} %)", file=sys.stderr)
    order = [point_id(p) for p in GRID]
    doc = {
        "about": "FSDP2 per-rank ground truth: gpumem trace (FSDPMemTracker, fake process group, rank 0, "
        "second iteration) of each run; made by validation/truth_fsdp.py",
        "points": [old[i] for i in order if i in old],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{len(done)} points {'re-estimated' if args.refresh_estimates else 'traced'} -> {OUT}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
