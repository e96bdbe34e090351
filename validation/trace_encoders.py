"""Trace the encoder reference points (BERT, RoBERTa with their task heads) into
``tests/reference/encoders/trace.json``.

Each point is one request to the trace worker (:mod:`gpumem_gui.trace.gpumem_trace_worker`) with the run's
``task`` naming the head (the worker builds ``AutoModelFor<Task>``; PEFT's task type for LoRA); see
``validation/trace_references.py`` for the decoder points. ``tests/test_encoders.py`` checks the replay
against them::

    .venv/bin/python validation/trace_encoders.py --python /tmp/gt-venv/bin/python [--only bert]
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
from validation.validate_report.common import GT_VENV  # noqa: E402

DIR = REPO / "tests" / "reference" / "encoders"
MODELS = (
    "google-bert__bert-base-uncased",
    "FacebookAI__roberta-base",
    "answerdotai__ModernBERT-base",
    "microsoft__deberta-v3-base",
)
# DebertaV2ForSequenceClassification's loss selects labels with nonzero(), which fake tensors cannot run
UNTRACEABLE_TRAINING = {"microsoft__deberta-v3-base": "sequence_classification"}
TASKS = ("sequence_classification", "token_classification", "masked_lm")


def inference_points() -> list[dict[str, Any]]:
    out = []
    for task in TASKS:
        out.append({"task": task, "batch": 1, "seq": 512, "attn": "sdpa"})
        out.append({"task": task, "batch": 4, "seq": 128, "attn": "eager"})
    return out


def training_points(model: str = "") -> list[dict[str, Any]]:
    """The sdpa points run without dropout: attention dropout sends CPU SDPA to its math path with a dropout
    mask, a CPU artefact (GPU kernels keep only their RNG state), which the replay does not model; the eager
    points keep the configs' 0.1 dropouts."""
    seq_cls, tok, mlm = TASKS
    nodrop = {"dropout": 0.0}
    points = [
        {"task": seq_cls, "precision": "amp-bf16", "batch": 8, "seq": 128, "attn": "sdpa", **nodrop},
        {"task": mlm, "precision": "bf16", "batch": 4, "seq": 128, "attn": "eager"},
        {
            "task": tok,
            "precision": "amp-bf16",
            "batch": 4,
            "seq": 256,
            "attn": "sdpa",
            "grad_ckpt": True,
            **nodrop,
        },
        {
            "task": seq_cls,
            "method": "lora",
            "precision": "bf16",
            "batch": 8,
            "seq": 128,
            "attn": "sdpa",
            "lora_rank": 8,
            **nodrop,
        },
        {
            "task": mlm,
            "method": "lora",
            "precision": "amp-bf16",
            "batch": 4,
            "seq": 128,
            "attn": "eager",
            "lora_rank": 8,
        },
        {
            "task": seq_cls,
            "method": "lora",
            "precision": "amp-bf16",
            "batch": 4,
            "seq": 128,
            "attn": "sdpa",
            "lora_rank": 8,
            **nodrop,
        },
    ]
    return [p for p in points if UNTRACEABLE_TRAINING.get(model) != p["task"]]


def _run(python: str, model: str, mode: str, run: dict[str, Any], timeout: int) -> dict[str, Any]:
    from gpumem_gui.trace import TraceFailure, TraceJob, TraceRequest

    config = json.loads((DIR / "configs" / f"{model}.json").read_text())
    req = TraceRequest(config=config, mode=mode, run=run)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    try:
        res = TraceJob(req, python, timeout).result()
    except TraceFailure as e:
        return {"model": model, "mode": mode, "run": run, "error": e.message[:300]}
    res.pop("schema", None)
    print(
        f"{model} {mode} {run}: {res.get('peak_bytes')} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr
    )
    return {"model": model, "mode": mode, "run": run, **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=str(GT_VENV / "bin" / "python"))
    ap.add_argument("--only", help="models whose name contains this")
    ap.add_argument("--kind", choices=["inference", "train", "all"], default="all")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args(argv)
    jobs = []
    for m in MODELS:
        if args.only and args.only not in m:
            continue
        if args.kind in ("inference", "all"):
            jobs += [(m, "inference", r) for r in inference_points()]
        if args.kind in ("train", "all"):
            jobs += [(m, "train", r) for r in training_points(m)]
    results = [_run(args.python, *j, args.timeout) for j in jobs]
    path = DIR / "trace.json"
    old = json.loads(path.read_text())["points"] if path.is_file() else []
    key = lambda r: (r["model"], r["mode"], json.dumps(r["run"], sort_keys=True))  # noqa: E731
    wanted = {
        key({"model": m, "mode": mode, "run": r})
        for m in MODELS
        for mode, pts in (("inference", inference_points()), ("train", training_points(m)))
        for r in pts
    }
    merged = {key(r): r for r in old if key(r) in wanted}  # points no longer asked for are dropped
    merged.update({key(r): r for r in results})
    doc = {
        "about": "Traced by validation/trace_encoders.py (the gpumem trace worker with the run's task head): "
        "the real transformers model under FakeTensorMode, counted by torch's MemTracker. Bytes.",
        "points": [merged[k] for k in sorted(merged)],
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
