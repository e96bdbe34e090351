"""What the session hands the window, and the rules between them. This module uses no Qt.

Every value here is immutable (frozen dataclasses holding the core's frozen models and tuples), so the
session can pass it to the window, and a background job can carry it out of and back into the GUI thread,
without a copy. The functions are the small decisions the session makes between a form edit and the chart:
which values a sweep takes, how a training run is checked against local GPUs, which ranked changes a local
machine can follow, which local GPUs the fit report suggests, whether a new GPU reading changes the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpumem_gui.core import (
    Calibration,
    Change,
    Estimate,
    FitReport,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    LoadedModel,
    ModelSpec,
    SizeUnit,
    SweepPoint,
    TrainingRun,
    Verdict,
    calibration_for,
    cancellable,
    fit_report,
    fit_training,
    fmt_bytes,
    sweep,
    verdicts,
    with_target_arch,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.target_form import GpuChoice, ResolvedTarget, resolve_target

SWEEP_POINTS = 48
TRAINING_SWEEP_POINTS = 16  # a training estimate replays a whole step: fewer points, same curve
BUSY_TEXT = "Working out what would make it fit…"
NO_TARGET_TEXT = "Pick a GPU target to see what would make it fit."
AnyRun = InferenceRun | TrainingRun


# ---- what crosses from the forms to the session and from the session to the window -------------------------


@dataclass(frozen=True)
class Inputs:
    """What the forms say when the session recomputes."""

    mode: str  # 'infer' or 'train'
    run: AnyRun | None  # None: the form already shows what is wrong with it
    choice: GpuChoice
    calibrations: tuple[Calibration, ...] = ()  # the saved ones; the one for the target's GPU applies


@dataclass(frozen=True)
class Problem:
    """The inputs cannot be estimated: the banner says ``banner`` over the last good numbers; ``message``
    goes next to the form's ``field`` (none when the form shows it already)."""

    banner: str
    field: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Plan:
    """One good estimate and what it is checked against."""

    run: AnyRun
    estimate: Estimate
    target: ResolvedTarget | None  # None: no GPU target (the target form says why)
    verdicts: tuple[Verdict, ...] = ()
    verdict_error: str | None = None  # the target exists but the core cannot check the plan against it
    estimate_ms: float = 0.0

    @property
    def free_now(self) -> int | None:
        t = self.target
        return t.free_now[0] if t and t.free_now else None

    @property
    def capacity_bytes(self) -> int | None:
        """The chart's capacity line: CUDA's total, what a verdict checks against."""
        return self.target.target.cuda_capacity if self.target else None


@dataclass(frozen=True)
class ReportView:
    """A fit report as the changes panel shows it: the changes a local machine can follow, and why others
    are left out; the local GPUs it suggests (a banner line)."""

    report: FitReport
    changes: tuple[Change, ...]
    note: str = ""
    suggestion: str | None = None


@dataclass(frozen=True)
class SweepView:
    over: str  # 'seq' or 'batch'
    points: tuple[SweepPoint, ...]
    capacity_bytes: int | None
    max_fit: int | None
    current: int


@dataclass(frozen=True)
class BackgroundView:
    """The worker's answer, ready to draw: the report (or why there is none) and the sweep."""

    report: ReportView | None
    message: str  # when there is no report
    sweep: SweepView
    estimate_ms: float
    background_ms: float


@dataclass(frozen=True)
class BackgroundResult:
    """What the worker thread returns."""

    report: FitReport | None
    report_error: str | None
    over: str
    points: tuple[SweepPoint, ...]
    seconds: float
    serial: int = 0  # the session's input serial when the job was made (see Session._inputs_serial)


@dataclass(frozen=True)
class SnapshotUpdate:
    """What a new GPU reading means for the window: the GPUs a target can use, and a first local target."""

    usable: tuple[GpuDevice, ...]
    auto_target: GpuChoice | None = None


# ---- rules -------------------------------------------------------------------------------------------------


def run_gpus(run: AnyRun) -> int:
    """GPUs the run occupies: tp x pp for inference, dp x tp x pp x cp for training."""
    return run.world if isinstance(run, TrainingRun) else run.gpus


def sweep_xs(spec: ModelSpec, run: AnyRun, over: str) -> list[int]:
    """The swept values: evenly up to a sensible maximum (training replays a whole step: fewer points)."""
    training = isinstance(run, TrainingRun)
    n = TRAINING_SWEEP_POINTS if training else SWEEP_POINTS
    if over == "batch":
        hi = max(2 * run.batch, 16 if training else 32)
    elif training:
        hi = max(2 * run.seq, min(spec.max_position_embeddings, 32768))
    else:
        hi = max(2 * run.seq, spec.max_position_embeddings)
    return sorted({max(1, round(hi * (i + 1) / n)) for i in range(n)})


def apply_update(base: AnyRun, update: dict) -> AnyRun:
    """``base`` with ``update`` applied (validated; raises on a bad update)."""
    cls = TrainingRun if isinstance(base, TrainingRun) else InferenceRun
    return cls.model_validate({**base.model_dump(), **update})


def training_target(resolved: ResolvedTarget, unit: SizeUnit) -> ResolvedTarget:
    """Local GPUs checked against free memory, for training: the estimate describes one replica's ranks
    (every data-parallel replica is the same), so each rank is checked against the least-free GPU."""
    free = resolved.target.free_bytes or ()
    low = min(free)
    worst = resolved.devices[free.index(low)] if resolved.devices else "?"
    target = resolved.target.model_copy(update={"free_bytes": (low,) * resolved.target.count})
    text = (
        f"{resolved.text}; every training rank against the least-free GPU ({worst}: "
        f"{fmt_bytes(low, unit)} free)"
    )
    return replace(resolved, target=target, text=text, free_now=(low,) * len(resolved.free_now or ()))


def resolve_for(
    run: AnyRun,
    choice: GpuChoice,
    snap: GpuSnapshot | None,
    unit: SizeUnit,
    cluster: GpuSnapshot | None = None,
    calibrations: tuple[Calibration, ...] = (),
) -> tuple[ResolvedTarget | None, str | None, AnyRun]:
    """The core's target for ``choice`` (``snap``: this machine's reading, ``cluster``: the cluster's;
    training on local or cluster GPUs: against the least-free one), or why there is none (a message for the
    target form's ``gpu`` field); and ``run`` as it is estimated: ``gpu_arch`` auto taken as a catalog
    target's generation (the CLI's ``--gpu`` does the same: core/fit/targets.py ``with_target_arch``; the
    window keeps the form's run for its command lines)."""
    try:
        resolved = resolve_target(choice, snap, unit, cluster)
        if isinstance(run, TrainingRun) and run.world > resolved.target.count:
            raise GpumemInputError(
                f"the run uses {run.world} GPUs (dp x tp x pp x cp) but the target has "
                f"{resolved.target.count}: raise the count",
                field="gpu",
            )
    except GpumemInputError as e:
        return None, e.message, run
    if isinstance(run, TrainingRun) and resolved.target.free_bytes:
        resolved = training_target(resolved, unit)
    cal = calibration_for(calibrations, resolved.target.name, run)
    if cal is not None:  # the saved calibration for this GPU: every estimate on it applies it
        resolved = replace(resolved, target=resolved.target.model_copy(update={"calibration": cal}))
    return resolved, None, with_target_arch(run, resolved.target)


def checked_plan(
    run: AnyRun, est: Estimate, resolved: ResolvedTarget | None, margin_bytes: int, estimate_ms: float
) -> Plan:
    """``est`` with the core's verdicts against ``resolved`` (or why the core cannot give them)."""
    if resolved is None:
        return Plan(run, est, None, estimate_ms=estimate_ms)
    est = resolved.target.calibrated(est)
    try:
        vs = verdicts(est, resolved.target, margin_bytes)
    except GpumemInputError as e:
        return Plan(run, est, resolved, verdict_error=e.message, estimate_ms=estimate_ms)
    return Plan(run, est, resolved, tuple(vs), estimate_ms=estimate_ms)


def usable_devices(snap: GpuSnapshot) -> tuple[GpuDevice, ...]:
    """The devices a target can use; a GPU in MIG mode is used through its instances, listed after it."""
    return tuple(
        d
        for d in snap.devices
        if d.ok and d.total_bytes is not None and not (d.mig_mode and snap.mig_instances(d.index))
    )


def local_changed(old: GpuSnapshot | None, new: GpuSnapshot, resolved: ResolvedTarget | None) -> bool:
    """Whether the reading changed anything the local target's plan depends on."""
    keys = resolved.devices if resolved and resolved.devices else ()
    if not keys or old is None:
        return True

    def state(s: GpuSnapshot) -> list[tuple]:
        return [
            (d.free_bytes, d.total_bytes, d.error) if (d := s.device(k)) else None  # type: ignore[misc]
            for k in keys
        ]

    return state(old) != state(new)


def local_gpu_count(resolved: ResolvedTarget | None, snap: GpuSnapshot | None) -> int | None:
    """How many whole GPUs this machine has (None when the target is not local or nothing was read)."""
    if resolved is None or not resolved.devices or resolved.cluster or snap is None:
        return None
    return sum(1 for d in snap.physical_devices if d.ok and not (d.mig_mode and snap.mig_instances(d.index)))


def report_view(
    rep: FitReport, run: AnyRun | None, resolved: ResolvedTarget | None, snap: GpuSnapshot | None
) -> ReportView:
    """The changes a local machine can follow (the others left out, with a note), and the local GPUs the
    report suggests when they differ from the target's."""
    changes = list(rep.changes)
    note = ""
    local = local_gpu_count(resolved, snap)
    if local is not None:
        kept = []
        for c in changes:
            try:
                need = run_gpus(apply_update(run, dict(c.update))) if run is not None else 0
            except Exception:
                need = 0
            if need <= local:
                kept.append(c)
        hidden = len(changes) - len(kept)
        if hidden:
            note = (
                f"{hidden} change(s) left out: they need more GPUs than this machine has ({local}); pick "
                "a catalog GPU to see them."
            )
        changes = kept
    suggestion = None
    machine = resolved is not None and bool(resolved.devices) and not resolved.cluster  # local GPUs
    if rep.local_gpus and machine and resolved is not None and run is not None:
        keys = [resolved.devices[i] for i in rep.local_gpus if i < len(resolved.devices)]
        if keys != list(resolved.devices) or (rep.local_tp or run.tp) != run.tp:  # a suggestion
            ids = ",".join(keys)
            tp = f" with tp {rep.local_tp}" if rep.local_tp else ""
            gpus = "GPU" if len(keys) == 1 else "GPUs"
            suggestion = f"use local {gpus} {ids}{tp} (CUDA_VISIBLE_DEVICES={ids})"
    return ReportView(rep, tuple(changes), note, suggestion)


def sweep_view(result: BackgroundResult, run: AnyRun | None, capacity_bytes: int | None) -> SweepView:
    """The sweep with the largest value that fits (from the report) and the current one marked."""
    rep, over = result.report, result.over
    if over == "seq" and isinstance(run, TrainingRun):
        max_fit = rep.max_context if rep else None
        current = run.seq
    elif over == "seq":
        max_fit = rep.max_context - run.new_tokens if rep and rep.max_context and run else None
        current = run.seq if run else 0
    else:
        max_fit = rep.max_batch if rep else None
        current = run.batch if run else 0
    return SweepView(over, tuple(result.points), capacity_bytes, max_fit, current)


def background_job(
    model: LoadedModel,
    run: AnyRun,
    target: GpuTarget | None,
    margin_bytes: int,
    over: str,
    serial: int,
    progress: Callable[[int, int], object] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Callable[[], BackgroundResult]:
    """The fit report and the sweep for one plan, as a job for the worker thread (it captures only immutable
    values: the spec, the weights, the run, the target; ``progress`` is the core sweep's callback, called in
    that thread: see :func:`progress_gate`). Once ``stop()`` says newer inputs replaced the plan, the fit
    report's solvers stop at their next estimate and the job raises :class:`Superseded` (core/cancel.py),
    which the worker drops (ui/workers.py)."""
    spec, weights = model.spec, model.weights
    assert spec is not None
    run = with_target_arch(run, target)  # sized for the target's GPU generation, as resolve_for's estimate

    def job() -> BackgroundResult:
        t0 = time.perf_counter()
        rep, err = None, None
        if target is not None:
            try:
                with cancellable(stop):
                    if isinstance(run, TrainingRun):
                        rep = fit_training(spec, run, target, margin_bytes)
                    else:
                        rep = fit_report(spec, run, target, margin_bytes, weights)
            except GpumemInputError as e:
                err = str(e)
        xs = sweep_xs(spec, run, over)
        points = sweep(
            spec, run, over, xs, target, margin_bytes, weights, skip_invalid=True, progress=progress
        )
        return BackgroundResult(rep, err, over, tuple(points), time.perf_counter() - t0, serial)

    return job


SWEEP_PROGRESS_AFTER_S = 0.3  # a sweep done sooner never shows its progress (a definition: no flicker)
SWEEP_PROGRESS_EVERY_S = 0.1  # then at most ten updates a second


def progress_gate(
    current: Callable[[], bool],
    report: Callable[[int, int], object],
    *,
    after_s: float | None = None,
    every_s: float | None = None,
) -> Callable[[int, int], bool]:
    """A ``progress(done, total)`` callback for :func:`~gpumem_gui.core.sweep`: it stops the sweep (returns
    False) once ``current()`` says newer inputs replaced it, and passes ``(done, total)`` on to ``report``
    only for a sweep running longer than ``after_s``, at most every ``every_s`` (and always its last
    point)."""
    after = SWEEP_PROGRESS_AFTER_S if after_s is None else after_s
    every = SWEEP_PROGRESS_EVERY_S if every_s is None else every_s
    start = time.monotonic()
    last = [float("-inf")]

    def progress(done: int, total: int) -> bool:
        if not current():
            return False
        now = time.monotonic()
        if now - start >= after and (now - last[0] >= every or done == total):
            last[0] = now
            report(done, total)
        return True

    return progress
