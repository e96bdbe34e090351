"""The training fit report and sweep of issue 30's examples: time them cold (no tape, no memo), and dump their
documents to compare two versions of the code to the byte.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_fit_training.py time
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fit_training.py cold
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fit_training.py window
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fit_training.py periods
    PYTHONPATH=. .venv/bin/python benchmarks/bench_fit_training.py dump OUT.json

``time`` prints, per case, the cold fit report, a warm one (the same run shape at a new sequence length) and a
64-point sequence sweep; ``cold`` the first estimate of a new model x run shape (replayed) and the recording
of its step tape (the first point within ``many_points``) for issue 30's examples and a MoE model; ``window``
the fit reports of four successive sequence lengths, as the window asks them while a field is edited (the
candidate changes' shapes are replayed twice, then recorded); ``periods`` the decoder layers whose event
segments repeat in each case's recorded step (:mod:`gpumem_gui.core.replay.tape_period`); ``dump`` writes
the estimate documents (with
their fit reports) of every case and of a walk over points and shape changes, and a walk over points of
``SHAPES`` (layers that differ in kind), in one order, so that ``cmp`` of two dumps says whether an answer
moved.
Never run by the test suite.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from benchmarks.bench_training import TRAIN_EXAMPLES, clear_training_cache
from gpumem_gui.core import GpumemInputError, estimate_document, gpu_target_from_text, load_model
from gpumem_gui.core.fit.sweep import evenly_spaced, sweep
from gpumem_gui.core.fit.training import fit_training
from gpumem_gui.core.training import estimate_training, make_training_run

MODEL = "meta-llama/Llama-3.1-8B"
# (name, run fields, target): issue 30's examples, the full fine-tune of the brief on an RTX 4090, and the
# README's torchtitan 3D run on 16 H100s
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("full b2 s2176, RTX-4090", {"method": "full", "seq": 2176, "batch": 2}, "RTX-4090"),
    ("LoRA + ckpt s4096, RTX-4090", {**TRAIN_EXAMPLES["LoRA + ckpt"], "seq": 4096}, "RTX-4090"),
    ("ZeRO-3 dp8 s4096, H100:8", {**TRAIN_EXAMPLES["ZeRO-3 dp8"], "seq": 4096}, "H100-SXM-80GB:8"),
    (
        "torchtitan dp2 tp2 pp2 + SP, H100:8",
        {**TRAIN_EXAMPLES["torchtitan FSDP2 x TP2 + SP x PP2"], "dp": 2, "seq": 4096},
        "H100-SXM-80GB:8",
    ),
    (
        "torchtitan dp4 tp2 pp2 + SP (README), H100:16",
        {**TRAIN_EXAMPLES["torchtitan FSDP2 x TP2 + SP x PP2"], "seq": 4096},
        "H100-SXM-80GB:16",
    ),
]


def _spec() -> Any:
    spec = load_model(MODEL).spec
    assert spec is not None
    return spec


def _ms(fn: Callable[[], object]) -> float:
    """CPU milliseconds of one call (the process's CPU time: steadier than the wall clock on shared cores)."""
    t = time.process_time()
    fn()
    return (time.process_time() - t) * 1e3


def time_cases(repeat: int = 3) -> None:
    """Per case the least of ``repeat`` runs: a cold fit (no tape, memo or cache), a warm one (the same shape
    at a new sequence length), a 64-point sequence sweep after them."""
    spec = _spec()
    head = f"case (CPU ms, least of {repeat})"
    print(f"{head:48} {'fit cold':>10} {'fit warm':>10} {'sweep 64':>10}")
    for name, fields, gpu in CASES:
        target = gpu_target_from_text(gpu)
        run = make_training_run(**fields)
        best = [float("inf")] * 3
        for k in range(repeat):
            clear_training_cache()
            cold = _ms(lambda: fit_training(spec, run, target))  # noqa: B023
            warm_run = run.model_copy(update={"seq": run.seq + 2 * run.tp * (k + 1)})
            warm = _ms(lambda: fit_training(spec, warm_run, target))  # noqa: B023
            xs = [8 * x + 2 * k for x in evenly_spaced(64, 1024, 64)]  # multiples of tp x cp
            sw = _ms(lambda: sweep(spec, run, "seq", xs, target))  # noqa: B023
            best = [min(a, b) for a, b in zip(best, (cold, warm, sw), strict=True)]
        print(f"{name:48} {best[0]:9.0f}ms {best[1]:9.0f}ms {best[2]:9.0f}ms", flush=True)


# the first estimate of a new model x run shape: issue 30's four examples and a MoE model with LoRA
COLD: list[tuple[str, str, dict[str, Any]]] = [
    *((name, MODEL, TRAIN_EXAMPLES[name]) for name in ("one GPU full", "LoRA + ckpt", "ZeRO-3 dp8")),
    ("torchtitan FSDP2 x TP2 + SP x PP2", MODEL, TRAIN_EXAMPLES["torchtitan FSDP2 x TP2 + SP x PP2"]),
    ("Qwen3-30B-A3B LoRA", "Qwen/Qwen3-30B-A3B", {"method": "lora"}),
]


def time_cold(repeat: int = 3) -> None:
    """Per case the least of ``repeat`` runs: the first estimate of its shape (no tape, no memo: replayed) and
    the same within ``many_points`` (its step tape recorded, then read)."""
    from gpumem_gui.core.replay.step_tape import many_points

    head = f"first of its shape, b1 s4096 (CPU ms, least of {repeat})"
    print(f"{head:48} {'replay':>10} {'record':>10}")
    for name, model, fields in COLD:
        spec = load_model(model).spec
        run = make_training_run(batch=1, seq=4096, **fields)
        estimate_training(spec, run)  # the model's own caches (its tensors, its adapters' targets) filled
        best = [float("inf")] * 2
        for k in range(repeat):
            for j, many in enumerate((False, True)):
                clear_training_cache()
                r = run.model_copy(update={"seq": 4096 + 2 * run.tp * (2 * k + j + 1)})
                with many_points() if many else nullcontext():
                    best[j] = min(best[j], _ms(lambda: estimate_training(spec, r)))  # noqa: B023
        print(f"{name:48} {best[0]:8.1f}ms {best[1]:8.1f}ms", flush=True)


def time_window(fits: int = 4) -> None:
    """Per case the fit reports of ``fits`` successive sequence lengths from cold (the window's edits)."""
    spec = _spec()
    print(
        f"{'case (CPU ms per fit report, in order)':48} "
        + " ".join(f"{'fit ' + str(i + 1):>9}" for i in range(fits))
    )
    for name, fields, gpu in CASES:
        target = gpu_target_from_text(gpu)
        run = make_training_run(**fields)
        clear_training_cache()
        runs = [run.model_copy(update={"seq": run.seq + 2 * run.tp * k}) for k in range(fits)]
        ms = [_ms(lambda r=r: fit_training(spec, r, target)) for r in runs]  # type: ignore[misc]  # noqa: B023
        print(f"{name:48} " + " ".join(f"{x:7.0f}ms" for x in ms), flush=True)


# run shapes whose layers are not all alike (issue 30's layer repetition must fall back or cut around them):
# MoE after dense first layers, sliding-window patterns, a pipeline's stages, Gemma 3n's AltUp and KV sharing,
# hybrids of linear attention or Mamba with attention, a VLM trained on images
SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("deepseek-ai/DeepSeek-V2-Lite", {"method": "lora"}),
    ("openai/gpt-oss-20b", {"method": "lora"}),
    ("google/gemma-2-2b", {"method": "full"}),
    ("google/gemma-3-1b-it", {"method": "full", "grad_ckpt": True}),
    (MODEL, {"method": "full", "pp": 4}),
    ("google/gemma-3n-E2B-it", {"method": "lora"}),
    ("Qwen/Qwen3.5-9B", {"method": "lora"}),
    ("nvidia/Nemotron-H-8B-Base-8K", {"method": "lora"}),
    ("google/gemma-3-4b-it", {"method": "lora", "images": 2}),
]


def time_periods() -> None:
    """Per case of ``COLD`` and ``SHAPES``, stage and phase: the runs of consecutive layers whose recorded
    event segments are equal (first-last and count), at b 1 s 4096."""
    from gpumem_gui.core.replay.step_tape import record_step
    from gpumem_gui.core.replay.tape_period import MarkedSim, MarkedTracker, layer_periods
    from gpumem_gui.core.training.rank import sharding_hooks, step_config, step_options

    for name, model, fields in [*COLD, *((f"{m} {f}", m, f) for m, f in SHAPES)]:
        spec = load_model(model).spec
        run = make_training_run(batch=1, seq=4096, **fields)
        for stage in range(run.pp):
            cfg, rspec = step_config(spec, run, stage, run)
            trackers: list[MarkedTracker] = []

            class Sim(MarkedSim):
                def __init__(self, *a: Any, **k: Any) -> None:
                    super().__init__(*a, **k)
                    trackers.append(self.tr)  # type: ignore[arg-type]  # noqa: B023

            hooks = lambda: sharding_hooks(run)  # noqa: E731, B023
            record_step(rspec, cfg, run.optimizer, step_options(run), hooks, sim=Sim)
            events = trackers[0].kept[0]
            runs = [
                f"{p.phase} {p.layers[0]}-{p.layers[-1]} ({len(p.layers)})"
                for p in layer_periods(*trackers[0].kept)
            ]
            print(f"{name} stage {stage} ({len(events)} events): {'; '.join(runs) or 'none'}", flush=True)


def _doc(spec: Any, run: Any, target: Any) -> dict[str, Any]:
    try:
        est = estimate_training(spec, run)
    except GpumemInputError as e:
        return {"error": str(e)}
    rep = fit_training(spec, run, target) if target is not None else None
    return estimate_document(MODEL, None, run, est, rep)


def dump(out: str) -> None:
    spec = _spec()
    docs = []
    clear_training_cache()
    for name, fields, gpu in CASES:
        target = gpu_target_from_text(gpu)
        run = make_training_run(**fields)
        docs.append({"case": name, "doc": _doc(spec, run, target)})
        # a walk of points and shape changes after the fit: seq, batch, accumulation, then a shape field
        for upd in (
            {"seq": run.seq + 2 * run.tp},
            {"batch": run.batch + 1},
            {"grad_accum": run.grad_accum + 3},
            {"seq": 1000 * run.tp, "batch": 3},
            {"grad_ckpt": not run.grad_ckpt},
            {"grad_ckpt": not run.grad_ckpt, "seq": 1002 * run.tp},
            {"seq": 3 * run.tp},
            {"allocator_model": True},
            {"allocator_model": True, "seq": 998 * run.tp},
        ):
            r = make_training_run(**{**run.model_dump(), **upd})
            docs.append({"case": f"{name} {upd}", "doc": _doc(spec, r, None)})
        xs = [8 * x for x in evenly_spaced(64, 1024, 16)]
        pts = sweep(spec, run, "seq", xs, target)
        docs.append({"case": f"{name} sweep", "points": [p.__dict__ for p in pts]})
    for model, fields in SHAPES:  # replayed twice, recorded, then read off the tape; a shape change
        spec = load_model(model).spec
        for upd in ({}, {"seq": 1024}, {"seq": 1536}, {"seq": 8192}, {"batch": 3}, {"grad_ckpt": True}):
            r = make_training_run(**{"seq": 512, **fields, **upd})
            docs.append({"case": f"{model} {fields} {upd}", "doc": _doc(spec, r, None)})
    with open(out, "w") as f:
        json.dump(docs, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    if sys.argv[1] == "time":
        time_cases()
    elif sys.argv[1] == "cold":
        time_cold()
    elif sys.argv[1] == "window":
        time_window()
    elif sys.argv[1] == "periods":
        time_periods()
    else:
        dump(sys.argv[2])
