"""Trace the encoder-decoder reference points (T5, mT5, UMT5, BART: ``generate()``'s encoder pass and decoder
steps, and fine-tuning steps) into ``tests/reference/seq2seq/trace.json``.

Each inference point is one request to the trace worker (:mod:`gpumem_gui.trace.gpumem_trace_worker`, which
builds ``AutoModelForSeq2SeqLM`` for an encoder-decoder config and runs :mod:`.seq2seq`'s ``trace_generate``):
``seq`` source tokens, ``new_tokens`` target tokens. Each training point is one ``train`` request: a warm-up
step, then a measured step of ``model(input_ids, labels=input_ids)`` (``seq`` source and target tokens).
``tests/test_seq2seq.py`` checks the replay against them; ``--only`` retraces the models whose name contains
it and merges them into the file::

    .venv/bin/python validation/trace_seq2seq.py --python /tmp/gt-venv/bin/python [--only bart]
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

DIR = REPO / "tests" / "reference" / "seq2seq"
# (model, batch, source tokens, new tokens, attention[, compute dtype: bf16 unless given])
POINTS: tuple[tuple[Any, ...], ...] = (
    ("google-t5__t5-small", 1, 256, 8, "sdpa", "fp32"),
    ("google-t5__t5-small", 2, 512, 64, "sdpa"),
    ("google-t5__t5-small", 2, 256, 32, "eager"),
    ("google-t5__t5-small", 1, 128, 1, "eager"),
    ("google-t5__t5-base", 1, 512, 1, "eager"),
    ("google-t5__t5-base", 4, 256, 128, "sdpa"),
    ("google__flan-t5-xl", 1, 1024, 16, "sdpa"),
    ("google__flan-t5-xl", 2, 256, 8, "eager"),
    ("google__mt5-small", 4, 128, 8, "sdpa"),
    ("google__umt5-small", 2, 512, 16, "sdpa"),
    ("google__umt5-small", 2, 256, 8, "eager"),
    ("facebook__bart-base", 1, 256, 8, "sdpa", "fp32"),
    ("facebook__bart-base", 2, 512, 32, "eager"),
    ("facebook__bart-base", 4, 256, 16, "sdpa"),
    ("facebook__bart-large-cnn", 1, 1024, 16, "sdpa"),
    ("facebook__bart-large-cnn", 2, 256, 1, "eager"),
    ("facebook__mbart-large-50", 1, 512, 8, "sdpa"),
    ("facebook__mbart-large-50", 2, 256, 16, "eager"),
)
# fine-tuning steps (model, run). SDPA points set dropout 0: CPU SDPA has no fused kernel for a dropout or for
# a mask that needs a gradient (T5's trainable position bias) and runs the math path, which GPUs do not
_SDPA = {"attn": "sdpa", "dropout": 0.0}
TRAIN_POINTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("google-t5__t5-small", {"precision": "bf16", "batch": 2, "seq": 256, "attn": "eager"}),
    ("google-t5__t5-small", {"precision": "amp-bf16", "batch": 4, "seq": 512, "grad_ckpt": True, **_SDPA}),
    (
        "google-t5__t5-small",
        {"method": "lora", "precision": "bf16", "batch": 4, "seq": 512, "lora_rank": 8, **_SDPA},
    ),
    ("google__flan-t5-xl", {"precision": "amp-bf16", "batch": 1, "seq": 256, "attn": "eager"}),
    ("google__mt5-small", {"method": "lora", "precision": "bf16", "batch": 2, "seq": 512, **_SDPA}),
    ("google__umt5-small", {"precision": "fp32", "batch": 2, "seq": 256, "attn": "eager"}),
    ("facebook__bart-base", {"precision": "amp-bf16", "batch": 4, "seq": 512, **_SDPA}),
    ("facebook__bart-base", {"precision": "bf16", "batch": 2, "seq": 256, "attn": "eager"}),
    ("facebook__bart-base", {"precision": "amp-bf16", "batch": 4, "seq": 512, "grad_ckpt": True, **_SDPA}),
    (
        "facebook__bart-base",
        {"method": "lora", "precision": "bf16", "batch": 4, "seq": 512, "lora_rank": 8, **_SDPA},
    ),
    ("facebook__mbart-large-50", {"precision": "amp-bf16", "batch": 2, "seq": 256, **_SDPA}),
    ("facebook__mbart-large-50", {"precision": "bf16", "batch": 1, "seq": 256, "attn": "eager"}),
    ("facebook__mbart-large-50", {"method": "lora", "precision": "bf16", "batch": 2, "seq": 256, **_SDPA}),
)


def _run(python: str, model: str, mode: str, run: dict[str, Any], timeout: int) -> dict[str, Any]:
    from gpumem_gui.trace import TraceFailure, TraceJob, TraceRequest

    config = json.loads((DIR / "configs" / f"{model}.json").read_text())
    req = TraceRequest(config=config, mode=mode, run=run)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    try:
        res = TraceJob(req, python, timeout).result()
    except TraceFailure as e:
        return {"model": model, "run": run, "mode": mode, "error": e.message[:300]}
    res.pop("schema", None)
    print(
        f"{model} {mode} {run}: {res.get('peak_bytes')} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr
    )
    return {"model": model, "run": run, **res}


def _jobs(only: str | None, mode: str | None) -> list[tuple[str, str, dict[str, Any]]]:
    jobs = []
    for model, batch, seq, new, attn, *dtype in POINTS:
        run = {"batch": batch, "seq": seq, "new_tokens": new, "attn": attn, "compute_dtype": "bf16"}
        jobs.append((model, "inference", {**run, **({"compute_dtype": dtype[0]} if dtype else {})}))
    jobs += [(model, "train", run) for model, run in TRAIN_POINTS]
    return [j for j in jobs if (only is None or only in j[0]) and (mode is None or mode == j[1])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=str(GT_VENV / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--only", help="retrace only the models whose name contains this (merged into the file)")
    ap.add_argument("--mode", choices=["inference", "train"], help="retrace only these points")
    args = ap.parse_args(argv)
    jobs = _jobs(args.only, args.mode)
    new = [_run(args.python, model, mode, run, args.timeout) for model, mode, run in jobs]
    path = DIR / "trace.json"
    key = lambda p: (p["model"], p.get("mode", "inference"), json.dumps(p["run"], sort_keys=True))  # noqa: E731
    merged = {key(p): p for p in (json.loads(path.read_text())["points"] if path.is_file() else [])}
    merged.update({key(p): p for p in new})
    doc = {
        "about": "Traced by validation/trace_seq2seq.py (the gpumem trace worker): the real transformers "
        "encoder-decoder under FakeTensorMode, counted by PyTorch's MemTracker",
        "points": list(merged.values()),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any("error" in p for p in new) else 0


if __name__ == "__main__":
    raise SystemExit(main())
