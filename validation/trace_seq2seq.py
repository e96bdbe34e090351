"""Trace the encoder-decoder reference points (T5, mT5, UMT5: ``generate()``'s encoder pass and decoder
steps) into ``tests/reference/seq2seq/trace.json``.

Each point is one inference request to the trace worker (:mod:`gpumem_gui.trace.gpumem_trace_worker`, which
builds ``AutoModelForSeq2SeqLM`` for an encoder-decoder config and runs :mod:`.seq2seq`'s ``trace_generate``):
``seq`` source tokens, ``new_tokens`` target tokens. ``tests/test_seq2seq.py`` checks the replay against
them::

    .venv/bin/python validation/trace_seq2seq.py --python /tmp/gt-venv/bin/python
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
)


def _run(python: str, model: str, run: dict[str, Any], timeout: int) -> dict[str, Any]:
    from gpumem_gui.trace import TraceFailure, TraceJob, TraceRequest

    config = json.loads((DIR / "configs" / f"{model}.json").read_text())
    req = TraceRequest(config=config, mode="inference", run=run)
    t0 = time.perf_counter()
    try:
        res = TraceJob(req, python, timeout).result()
    except TraceFailure as e:
        return {"model": model, "run": run, "error": e.message[:300]}
    res.pop("schema", None)
    print(f"{model} {run}: {res.get('peak_bytes')} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return {"model": model, "run": run, **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=str(GT_VENV / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args(argv)
    points = []
    for model, batch, seq, new, attn, *dtype in POINTS:
        run = {
            "batch": batch,
            "seq": seq,
            "new_tokens": new,
            "attn": attn,
            "compute_dtype": "bf16",
            **({"compute_dtype": dtype[0]} if dtype else {}),
        }
        points.append(_run(args.python, model, run, args.timeout))
    doc = {
        "about": "Traced by validation/trace_seq2seq.py (the gpumem trace worker): the real transformers "
        "encoder-decoder under FakeTensorMode, counted by PyTorch's MemTracker",
        "points": points,
    }
    (DIR / "trace.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
