"""The session: the state between a form edit and the chart, and the decisions about what to recompute.

No widgets here. The session holds the loaded model, the current run (inference or training), the GPU target
choice and the latest GPU reading, the last good plan (estimate and verdicts), the fit report and the sweep.
It reads the forms through one callable (``read_inputs``, which the window provides), calls the core through
its facade, runs the fit report and the sweep on a :class:`~gpumem_gui.ui.workers.BackgroundRunner`, and tells
the window what to draw through signals that carry immutable values (:mod:`gpumem_gui.ui.plan`).

Every edit restarts a single-shot timer (:class:`~gpumem_gui.ui.timing.Debounce`): 120 ms while typing into a
text field; for a step, a number entered with Enter, a pick from a list or a click it fires on the next pass
of the event loop (changes made in one pass still make one estimate). When it fires, one estimate runs in the
GUI thread (a few ms for inference; 1-200 ms for training, which replays one step) and the window draws it;
once that is painted, the fit report and the sweep (inference: 48 points, ~50-300 ms; training: 16 points and
the training solvers, 1-5 s) run in a worker thread and only the newest answer is shown (the worker holds the
GIL while it runs: started before the paint, it would slow the paint down, the first one at start-up
included). Invalid input is a :class:`~gpumem_gui.ui.plan.Problem` and the last good plan stays. New
free-memory readings for the same inputs are a *refresh*: the fit report on screen stays up (not greyed) while
it is redone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

from gpumem_gui.core import (
    Estimate,
    FitReport,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    LoadedModel,
    SizeUnit,
    Verdict,
    driver_gpu_memory,
    estimate_any,
    estimate_inference,
    runtime,
    verdicts,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.messages import error_line, one_line
from gpumem_gui.ui.plan import (
    BUSY_TEXT,
    NO_TARGET_TEXT,
    AnyRun,
    BackgroundResult,
    BackgroundView,
    Inputs,
    Plan,
    Problem,
    ReportView,
    SnapshotUpdate,
    background_job,
    checked_plan,
    local_changed,
    progress_gate,
    report_view,
    resolve_for,
    sweep_view,
    usable_devices,
)
from gpumem_gui.ui.report import worst_verdict
from gpumem_gui.ui.target_form import GpuChoice, ResolvedTarget
from gpumem_gui.ui.timing import DEBOUNCE_MS, STEP_DEBOUNCE_MS, AfterPaint, Debounce
from gpumem_gui.ui.workers import BackgroundRunner

FIX_FIELD_TEXT = "Fix the highlighted field; the numbers below are for the last valid input."


class Session(QObject):
    """The plan's state and its recomputation (see module docstring).

    Args:
        read_inputs: reads the forms (the active form checks its run and shows its own errors).

    Signals:
        target_checked(object): the GPU target was checked: None, or why there is none (field ``gpu``).
        problem(object): a :class:`Problem`; the last good plan stays.
        plan_ready(object): a new :class:`Plan` to draw.
        report_ready(object): a :class:`ReportView` to draw (a kept report, or one redrawn).
        report_pending(str): the fit report is being worked out (the one on screen is out of date).
        background_ready(object): a :class:`BackgroundView` (fit report and sweep) to draw.
        report_failed(str): no fit report to show: what to say instead (the worker failed, or its answer
            could not be shown).
        sweep_progress(int, int): points done and in all of a sweep running long (emitted by the worker).
        estimate_updated(): the new plan is drawn.
        background_done(): the fit report and the sweep for the current inputs are drawn (or failed).
    """

    target_checked = Signal(object)
    problem = Signal(object)
    plan_ready = Signal(object)
    report_ready = Signal(object)
    report_pending = Signal(str)
    background_ready = Signal(object)
    report_failed = Signal(str)
    sweep_progress = Signal(int, int)
    estimate_updated = Signal()
    background_done = Signal()

    def __init__(
        self,
        read_inputs: Callable[[], Inputs],
        *,
        debounce_ms: int = DEBOUNCE_MS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._read_inputs = read_inputs
        self.unit = SizeUnit.GIB
        self.sweep_over = "seq"
        self.target_user_set = False  # a target was chosen: the first GPU reading must not replace it
        self.last_estimate_ms = 0.0
        self.last_background_ms = 0.0
        self._model: LoadedModel | None = None
        self._run: AnyRun | None = None
        self._resolved: ResolvedTarget | None = None
        self._choice = GpuChoice()
        self._plan: Plan | None = None
        self._fit: FitReport | None = None
        self._snapshot: GpuSnapshot | None = None
        self._cluster_snapshot: GpuSnapshot | None = None  # the cluster view's latest reading
        self._capacity_cache: dict[tuple[int, int], Estimate] = {}
        # bumped by every recompute except a refresh for new free-memory readings; a fit report made for the
        # same serial is still worth showing when a refresh superseded it (busy GPUs change every poll)
        self._inputs_serial = 0
        self._refresh_pending = False
        self._refreshing = False
        self._job_token = 0  # the newest background job's: an older job's sweep stops early

        self.debounce = Debounce(debounce_ms, STEP_DEBOUNCE_MS, self)
        self.debounce.timeout.connect(self._on_debounce)
        # the worker starts a moment after the plan is painted (the window reports paints: paint_pass)
        self._after_paint = AfterPaint(self.start_background, parent=self)
        self._bg = BackgroundRunner("fit-and-sweep", 1, self)
        self._bg.finished.connect(self._on_background_finished)
        self._bg.failed.connect(self._on_background_failed)

    # ---- state -------------------------------------------------------------------------------------------

    @property
    def model(self) -> LoadedModel | None:
        return self._model

    @property
    def run(self) -> AnyRun | None:
        """The run of the last good estimate."""
        return self._run

    @property
    def plan(self) -> Plan | None:
        """The last good plan (None before the first, or for a model whose architecture is unknown)."""
        return self._plan

    @property
    def estimate(self) -> Estimate | None:
        return self._plan.estimate if self._plan else None

    @property
    def report(self) -> FitReport | None:
        return self._fit

    @property
    def resolved(self) -> ResolvedTarget | None:
        """The GPU target of the last good estimate (None: no target)."""
        return self._resolved

    @property
    def snapshot(self) -> GpuSnapshot | None:
        return self._snapshot

    def set_model(self, m: LoadedModel) -> None:
        """Make ``m`` the model; a model without an architecture (no config.json) has no plan."""
        self._model = m
        self._capacity_cache.clear()
        if m.spec is None:
            self._plan = None

    def set_unit(self, unit: SizeUnit) -> None:
        self.unit = unit

    def set_sweep_over(self, over: str) -> None:
        self.sweep_over = over
        self.start_background()

    def drop_report(self) -> None:
        """The fit report no longer describes the inputs (the mode changed)."""
        self._fit = None

    def report_view(self, rep: FitReport) -> ReportView:
        return report_view(rep, self._run, self._resolved, self._snapshot)

    # ---- scheduling --------------------------------------------------------------------------------------

    def schedule(self, typing: bool = True) -> None:
        """Recompute after the debounce interval (restarted by every edit; short unless ``typing``)."""
        self._refresh_pending = False
        self.debounce.restart(typing)

    def schedule_refresh(self) -> None:
        """Recompute for new GPU readings (same inputs): unless an edit is pending (it reads them too), a
        refresh."""
        if not self.debounce.isActive():
            self._refresh_pending = True
            self.debounce.restart()

    def _on_debounce(self) -> None:
        refresh, self._refresh_pending = self._refresh_pending, False
        self._refreshing = refresh
        try:
            self.recompute_now()
        finally:
            self._refreshing = False

    # ---- computing ---------------------------------------------------------------------------------------

    @Slot()
    def recompute_now(self) -> None:
        """Estimate now (GUI thread), have it drawn, then start the fit report and sweep in the worker."""
        self.debounce.stop()
        try:
            self._recompute()
        except Exception as e:  # a core bug must not take the window down; keep the last estimate
            self.problem.emit(Problem(f"unexpected error: {error_line(e)}"))

    def _recompute(self) -> None:
        m = self._model
        if m is None or m.spec is None:
            return
        inputs = self._read_inputs()
        run = inputs.run
        if run is None:
            self.problem.emit(Problem(FIX_FIELD_TEXT))
            return
        self._choice = inputs.choice
        resolved, target_error, sized = resolve_for(  # sized: gpu_arch auto as the target's generation
            run, inputs.choice, self._snapshot, self.unit, self._cluster_snapshot, inputs.calibrations
        )
        self.target_checked.emit(target_error)
        t0 = time.perf_counter()
        try:
            est = estimate_any(m.spec, sized, resolved.target.capacity_bytes if resolved else None, m.weights)
        except GpumemInputError as e:
            banner = f"{error_line(e)} (the numbers below are for the last valid input)"
            self.problem.emit(Problem(banner, e.field, one_line(e.message)))
            return
        self.last_estimate_ms = (time.perf_counter() - t0) * 1000
        refresh = self._refreshing and run == self._run
        if not refresh:
            self._inputs_serial += 1
        self._run, self._resolved = run, resolved
        self._plan = checked_plan(run, est, resolved, self._choice.margin_bytes, self.last_estimate_ms)
        keep = refresh and self._fit is not None  # keep the last report up (not greyed) while it is redone
        if not keep:
            self._fit = None
        self._after_paint.arm()
        self.plan_ready.emit(self._plan)
        if self._fit is not None:
            self.report_ready.emit(self.report_view(self._fit))
        else:
            self.report_pending.emit(BUSY_TEXT)
        self.estimate_updated.emit()

    def evaluate_device(self, dev: GpuDevice, available: int) -> Verdict | None:
        """The plan's verdict on one device, from the core (an engine that sizes a pool from the device's
        memory, vLLM, is estimated again for it)."""
        est, run, model = self.estimate, self._run, self._model
        if est is None or run is None or model is None or model.spec is None or dev.total_bytes is None:
            return None
        if (
            est.mode == "inference"
            and runtime(est.engine).sizes_from_capacity
            and isinstance(run, InferenceRun)
        ):
            memory = driver_gpu_memory(dev.total_bytes, dev.reserved_bytes)  # the engines read CUDA's
            key = (id(est), dev.total_bytes)
            cached = self._capacity_cache.get(key)
            if cached is None:
                try:
                    cached = estimate_inference(model.spec, run, memory, model.weights)
                except GpumemInputError:
                    return None
                self._capacity_cache = {k: v for k, v in self._capacity_cache.items() if k[0] == id(est)}
                self._capacity_cache[key] = cached
            est = cached
        n = len(est.per_gpu)
        target = GpuTarget(
            name=dev.name, capacity_bytes=dev.total_bytes, count=n, free_bytes=(available,) * n
        )
        try:
            vs = verdicts(est, target, self._choice.margin_bytes)
        except GpumemInputError:
            return None
        return worst_verdict(vs)

    # ---- GPU readings ------------------------------------------------------------------------------------

    def take_snapshot(self, snap: GpuSnapshot, choice: GpuChoice) -> SnapshotUpdate:
        """A new reading; ``choice`` is the target form's. The first reading with usable GPUs makes the first
        of them the target (unless one was chosen); later ones recompute when the local target's GPUs
        changed."""
        old, self._snapshot = self._snapshot, snap
        usable = usable_devices(snap)
        if not self.target_user_set and usable:
            self.target_user_set = True
            self.schedule()
            update = {"kind": "local", "device": usable[0].key, "count": 1}
            return SnapshotUpdate(usable, choice.model_copy(update=update))
        if choice.kind == "local" and local_changed(old, snap, self._resolved):
            self.schedule_refresh()
        return SnapshotUpdate(usable)

    def take_cluster_snapshot(self, snap: GpuSnapshot) -> None:
        """A new cluster reading: recompute when the target is a cluster GPU whose reading changed."""
        old, self._cluster_snapshot = self._cluster_snapshot, snap
        if self._choice.kind == "cluster" and local_changed(old, snap, self._resolved):
            self.schedule_refresh()

    # ---- the fit report and the sweep --------------------------------------------------------------------

    def paint_pass(self) -> None:
        """The window is about to paint: once that pass is over, start the worker."""
        self._after_paint.paint_pass()

    def _background_job(self) -> Callable[[], BackgroundResult] | None:
        m, run, resolved = self._model, self._run, self._resolved
        if m is None or m.spec is None or run is None:
            return None
        self._job_token = token = self._job_token + 1
        progress = progress_gate(lambda: token == self._job_token, self.sweep_progress.emit)
        plan = (m, run, resolved.target if resolved else None, self._choice.margin_bytes, self.sweep_over)
        return background_job(*plan, self._inputs_serial, progress, lambda: token != self._job_token)

    @Slot()
    def start_background(self) -> None:
        self._after_paint.cancel()
        job = self._background_job()
        if job is None:
            return
        if self._fit is None:
            self.report_pending.emit(BUSY_TEXT)
        self._bg.submit(job)

    def flush_background(self, timeout_ms: int = 10000) -> bool:
        """Start a delayed job now, wait for the worker and deliver its result (tests, export, self-test)."""
        if self._after_paint.pending:
            self.start_background()
        ok = self._bg.wait(timeout_ms)
        QCoreApplication.processEvents()
        return ok

    def finish_background_here(self) -> None:
        """Bring the fit report and the sweep up to date in this thread (an export needs them now)."""
        job = self._background_job()
        if job is not None:
            self._bg.wait(10000)
            self._apply_background(job())

    @Slot(int, object)
    def _on_background_finished(self, job_id: int, result: object) -> None:
        if not isinstance(result, BackgroundResult):
            return
        latest = job_id == self._bg.latest
        if not latest and result.serial != self._inputs_serial:
            return  # made for inputs that have changed since
        try:
            self._apply_background(result)
        except Exception as e:  # never raise out of a slot
            self.report_failed.emit(f"could not show the fit report: {error_line(e)}")
        if latest:
            self.background_done.emit()

    def _apply_background(self, result: BackgroundResult) -> None:
        self.last_background_ms = result.seconds * 1000
        self._fit = rep = result.report
        capacity = self._resolved.target.cuda_capacity if self._resolved else None
        view = BackgroundView(
            report=self.report_view(rep) if rep is not None else None,
            message=result.report_error or NO_TARGET_TEXT,
            sweep=sweep_view(result, self._run, capacity),
            estimate_ms=self.last_estimate_ms,
            background_ms=self.last_background_ms,
        )
        self.background_ready.emit(view)

    @Slot(int, str)
    def _on_background_failed(self, job_id: int, message: str) -> None:
        if job_id == self._bg.latest:
            self.report_failed.emit(f"fit report failed: {message}")
            self.background_done.emit()

    def shutdown(self) -> None:
        """Stop the timers and the worker."""
        self.debounce.stop()
        self._after_paint.stop()
        self._bg.shutdown(5000)
