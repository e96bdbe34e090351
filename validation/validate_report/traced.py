"""Section (f): the points PyTorch itself traced (``tests/reference/trace``, written by
``validation/trace_references.py`` with the trace worker: the real transformers model under FakeTensorMode,
counted by MemTracker), against our estimates: inference prefill/decode peaks, training step peaks."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from gpumem_gui.core import estimate_inference
from gpumem_gui.core.readers.hf_config import SUPPORTED_MODEL_TYPES
from gpumem_gui.core.reference_points import (
    TRACED_INFERENCE_TOLERANCE,
    TRACED_TRAINING_TOLERANCE,
    traced_inference_run,
    traced_training_run,
)
from gpumem_gui.core.training import simulate_rank

from .architectures import render_architectures
from .common import HERE, spec_for

TRACE = HERE.parent / "tests" / "reference" / "trace"


def _points(kind: str) -> list[dict]:
    path = TRACE / f"{kind}.json"
    if not path.is_file():
        return []
    return [p for p in json.loads(path.read_text())["points"] if "error" not in p]


def inference_errors() -> list[tuple[str, float]]:
    """(setup, relative error) of every traced prefill and decode peak."""
    out = []
    for p in _points("inference"):
        run = traced_inference_run(p)
        est = estimate_inference(spec_for(f"config:{p['model']}"), run)
        for ph in ("prefill", "decode"):
            if ph in p["phases"]:
                meas = p["phases"][ph]["Total"]
                setup = f"{p['model']} · {ph} · b{run.batch} s{run.seq}+{run.new_tokens} · {run.attn}"
                out.append((setup, (est.phases[ph].peak_bytes - meas) / meas))
    return out


def training_errors() -> list[tuple[str, float]]:
    """(setup, relative error) of every traced training step's peak (the replay with the CPU's dropout
    kernel, as the trace ran on the CPU)."""
    out = []
    for p in _points("train"):
        run = traced_training_run(p)
        res, _, _ = simulate_rank(spec_for(f"config:{p['model']}"), run, cpu_dropout=True)
        meas = max(m["Total"] for m in p["phases"].values())
        setup = f"{p['model']} · {run.method} {run.precision} · b{run.batch} s{run.seq} · {run.attn}"
        setup += " · checkpointing" if run.grad_ckpt else ""
        out.append((setup, (max(ph.total for ph in res.phases.values()) - meas) / meas))
    return out


def _line(name: str, errs: list[tuple[str, float]]) -> str:
    if not errs:
        return f"- **{name}**: no traced points (run `validation/trace_references.py`)"
    worst = max(errs, key=lambda e: abs(e[1]))
    within = sum(1 for _, e in errs if abs(e) < TRACED_TRAINING_TOLERANCE)
    return (
        f"- **{name}** ({len(errs)} points): median |error| "
        f"{statistics.median(abs(e) for _, e in errs) * 100:.2f} %, "
        f"{within} within {TRACED_TRAINING_TOLERANCE * 100:g} %, worst {worst[1] * 100:+.2f} % at {worst[0]}"
    )


def _described(model: str) -> bool:
    """Whether the readers describe a model the trace check once ran without an analytic estimate."""
    path = HERE.parent / "tests" / "reference" / "unsupported" / "configs" / f"{model}.json"
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("model_type") in SUPPORTED_MODEL_TYPES


def _trace_check_line() -> str:
    """``gpumem trace`` itself against every reference measurement (validation/trace_groundtruth.py)."""
    path = TRACE / "groundtruth_check.json"
    if not path.is_file():
        return "- **gpumem trace vs the reference measurements**: not run (`make trace-check`)"
    doc = json.loads(path.read_text())
    rows, tolerance = doc["points"], doc["tolerance"]  # trace_groundtruth.py's
    ok = [r for r in rows if "relative_error" in r]
    worst = max((abs(r["relative_error"]) for r in ok), default=0.0)
    within = sum(1 for r in ok if abs(r["relative_error"]) <= tolerance)
    new_types = sorted({r["model"] for r in ok if not r.get("analytic", True) and not _described(r["model"])})
    return (
        f"- **gpumem trace vs the reference measurements** ({len(rows)} points, `make trace-check`): "
        f"{within} within {tolerance * 100:g} %, worst |error| {worst * 100:.4f} %"
        + (
            f"; including {', '.join(new_types)}, a model type the analytic core does not describe"
            if new_types
            else ""
        )
    )


def render_traced(add: Callable[[str], None]) -> None:
    infer, train = inference_errors(), training_errors()
    add(f"## (f) Traced by PyTorch: {len(infer)} inference peaks and {len(train)} training steps")
    add("")
    add(
        "Each point is the real transformers 5.24 model built under `FakeTensorMode` and counted by "
        "`torch.distributed._tools.mem_tracker.MemTracker` on the CPU (the trace worker, `gpumem_gui/trace/"
        "gpumem_trace_worker/`, run by "
        "`validation/trace_references.py`; the points are in `tests/reference/trace/`). They cover the "
        "architectures the measured grid above lacks (BLOOM, Falcon, GPT-NeoX, OPT, Phi-3, Granite, OLMo-2, "
        "Starcoder2, DeepSeek-V2-Lite, synthetic MoE configs), every model type added since (the table "
        "below; large models through scaled-down synthetic copies of the same structure) and LoRA with "
        "PEFT's own module resolution. "
        f"`tests/test_replay.py` holds every point to {TRACED_INFERENCE_TOLERANCE * 100:g} % (inference) and "
        f"{TRACED_TRAINING_TOLERANCE * 100:g} % (training)."
    )
    add("")
    add(_line("inference prefill/decode peak", infer))
    add(_line("training step peak", train))
    add(_trace_check_line())
    add("")
    render_architectures(add, infer, train)
    known = (
        json.loads((TRACE / "known.json").read_text())["known"] if (TRACE / "known.json").is_file() else {}
    )
    if known:
        add("Training points not matched yet (strict expected failures in the tests):")
        add("")
        add("| model / kind | what is known |")
        add("|---|---|")
        for key, reason in sorted(known.items()):
            add(f"| {key} | {reason} |")
