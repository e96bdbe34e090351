"""Estimates of one run at many batch sizes or sequence lengths, shared by ``gpumem sweep`` and the window."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.fit import DEFAULT_MARGIN_BYTES, GpuTarget, verdicts
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import InferenceRun, estimate_inference
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun, estimate_training

Run = InferenceRun | TrainingRun


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
    spec: ModelSpec, run: Run, capacity: int | None = None, file_weights: WeightsInventory | None = None
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
) -> list[SweepPoint]:
    """The estimate of ``run`` with ``over`` ('seq' or 'batch') set to each x; with a target, the verdict.

    ``skip_invalid`` drops points the model rejects (a window sweeping blindly) instead of raising.
    """
    out: list[SweepPoint] = []
    fields = run.model_dump()
    for x in xs:
        try:
            try:  # validated like a run the user typed: an x outside the field's range is an input error
                point_run = type(run).model_validate({**fields, over: x})
            except ValidationError as e:
                raise describe_validation_error(e, source="sweep") from None
            est = estimate_any(spec, point_run, target.capacity_bytes if target else None, file_weights)
            fits = all(v.fits for v in verdicts(est, target, margin)) if target is not None else None
        except GpumemInputError:
            if skip_invalid:
                continue
            raise
        out.append(
            SweepPoint(
                x=x,
                peak_bytes=est.peak_bytes,
                total_bytes=est.total_bytes,
                kv_cache_bytes=est.kv_cache_bytes,
                peak_phase=est.peak_phase,
                fits=fits,
            )
        )
    return out
