"""Estimates of one run at many batch sizes or sequence lengths, shared by ``gpumem sweep`` and the window.

A sweep has at most :data:`MAX_SWEEP_POINTS` points for its mode, so that the slowest model of the catalog
still answers within :data:`SWEEP_BUDGET_S`; a caller may follow it with a ``progress(done, total)``
callback (the CLI's progress bar, the window's) and stop it by returning False.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.fit import DEFAULT_MARGIN_BYTES, GpuTarget, verdicts
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.replay.step_tape import many_points
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import InferenceRun, estimate_inference
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun, estimate_training

Run = InferenceRun | TrainingRun
Mode = Literal["inference", "train"]
Progress = Callable[[int, int], object]

# The longest a sweep may take at the slowest measured cost per point (a definition: a minute is as long as
# anyone waits for a table; the progress bar covers the wait).
SWEEP_BUDGET_S = 60.0
# Seconds one sweep point costs, the slowest of every catalog model (prompts of 1,000-5,000 tokens; inference
# engines transformers, vLLM and llama.cpp; training plain and ZeRO-3 with checkpointing), measured for issue
# 18 on the development machine's CPU: inference at most 2.5 ms (gemma-3-27b-it under transformers, median
# 0.16 ms), training at most 97 ms (Llama-3.1-405B, ZeRO-3; median 20-24 ms), rounded up.
POINT_COST_S: dict[Mode, float] = {"inference": 2.5e-3, "train": 0.1}
# Points per sweep: the budget over the cost, i.e. 24,000 inference and 600 training points (the old single
# cap of 100,000 let a training sweep run ~18 minutes).
MAX_SWEEP_POINTS: dict[Mode, int] = {m: int(SWEEP_BUDGET_S / c) for m, c in POINT_COST_S.items()}
# The replay walks every layer, so a point costs in proportion to the layer count: the caps above hold up to
# the layer count of the model they were measured on (gemma-3-27b-it: 62 layers; Llama-3.1-405B: 126) and
# shrink in proportion beyond it (a 4,096-layer config found by the fuzz suite took 3.9 s per training point).
REFERENCE_LAYERS: dict[Mode, int] = {"inference": 62, "train": 126}


def sweep_mode(run: Run) -> Mode:
    return "inference" if isinstance(run, InferenceRun) else "train"


def sweep_cap(run: Run, layers: int | None = None) -> int:
    """The most points a sweep of ``run`` may have: the mode's cap, shrunk for a model with more layers than
    the one the cap was measured on (at least 1)."""
    mode = sweep_mode(run)
    scale = max(1.0, (layers or 0) / REFERENCE_LAYERS[mode])
    return max(1, int(MAX_SWEEP_POINTS[mode] / scale))


def check_sweep_size(run: Run, points: int, layers: int | None = None) -> None:
    """Raise :class:`GpumemInputError` (field ``steps``) when ``points`` is over :func:`sweep_cap`."""
    mode = sweep_mode(run)
    cap = sweep_cap(run, layers)
    if points > cap:
        deeper = f", {layers:,} layers" if cap < MAX_SWEEP_POINTS[mode] else ""
        raise GpumemInputError(
            f"{points:,} points; a {mode} sweep of this model{deeper} takes at most {cap:,} (about "
            f"{SWEEP_BUDGET_S:g} s at worst)",
            field="steps",
        )


@dataclass(frozen=True)
class SweepPoint:
    """One point: the swept value, the estimate's totals, and whether it fits the target (None: no target)."""

    x: int
    peak_bytes: int
    total_bytes: int
    kv_cache_bytes: int
    peak_phase: str
    fits: bool | None


def estimate_any(
    spec: ModelSpec,
    run: Run,
    capacity: int | GpuMemory | None = None,
    file_weights: WeightsInventory | None = None,
) -> Estimate:
    """An inference or a training estimate, by the run's type."""
    if isinstance(run, InferenceRun):
        return estimate_inference(spec, run, capacity, file_weights)
    return estimate_training(spec, run)


def evenly_spaced(lo: int, hi: int, n: int) -> list[int]:
    """``n`` integers from ``lo`` to ``hi`` (both included when n > 1), duplicates dropped."""
    return sorted({round(lo + (hi - lo) * i / max(1, n - 1)) for i in range(n)})


def sweep(
    spec: ModelSpec,
    run: Run,
    over: str,
    xs: Iterable[int],
    target: GpuTarget | None = None,
    margin: int = DEFAULT_MARGIN_BYTES,
    file_weights: WeightsInventory | None = None,
    skip_invalid: bool = False,
    progress: Progress | None = None,
) -> list[SweepPoint]:
    """The estimate of ``run`` with ``over`` ('seq' or 'batch') set to each x; with a target, the verdict.

    ``skip_invalid`` drops points the model rejects (a window sweeping blindly) instead of raising. More
    points than :data:`MAX_SWEEP_POINTS` allows for the run's mode are an input error (field ``steps``).
    ``progress(done, total)`` is called with ``done = 0`` before the first point and after every point (on
    the caller's thread); when it returns False the sweep stops and returns the points so far.
    """
    xs = list(xs)
    check_sweep_size(run, len(xs), spec.num_layers)
    out: list[SweepPoint] = []
    fields = run.model_dump()
    validate = type(run).model_validate
    if progress is not None and progress(0, len(xs)) is False:
        return out
    # one shape and micro-batch at many lengths: a training step's tape recorded at once (over the batch, the
    # first points would be b = 1, whose guards (replay/step.py's loss) differ from the next ones)
    with many_points() if over == "seq" else nullcontext():
        for i, x in enumerate(xs, 1):
            try:
                out.append(_point(spec, validate, fields, over, x, target, margin, file_weights))
            except GpumemInputError:
                if not skip_invalid:
                    raise
            if progress is not None and progress(i, len(xs)) is False:
                break
    return out


def _point(
    spec: ModelSpec,
    validate: Callable[[object], Run],
    fields: dict[str, object],
    over: str,
    x: int,
    target: GpuTarget | None,
    margin: int,
    file_weights: WeightsInventory | None,
) -> SweepPoint:
    try:  # validated like a run the user typed: an x outside the field's range is an input error
        point_run = validate({**fields, over: x})
    except ValidationError as e:
        raise describe_validation_error(e, source="sweep") from None
    est = estimate_any(spec, point_run, target.memory if target else None, file_weights)
    est = target.calibrated(est) if target is not None else est
    return SweepPoint(
        x=x,
        peak_bytes=est.peak_bytes,
        total_bytes=est.total_bytes,
        kv_cache_bytes=est.kv_cache_bytes,
        peak_phase=est.peak_phase,
        fits=all(v.fits for v in verdicts(est, target, margin)) if target is not None else None,
    )
