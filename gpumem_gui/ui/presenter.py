"""Draws what the session hands over: plans, problems, fit reports and sweeps, into the results, the forms'
inline errors, the GPU cards and the status bar's timing.

Every slot here is connected to a session signal; none raises (a bug in drawing becomes a message on the
results, and the last good numbers stay).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel

from gpumem_gui.core import SizeUnit
from gpumem_gui.ui.field_form import FieldForm
from gpumem_gui.ui.gpu_glue import GpuGlue
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.plan import BackgroundView, Plan, Problem, ReportView
from gpumem_gui.ui.results import ResultsView
from gpumem_gui.ui.session import Session
from gpumem_gui.ui.target_form import TargetForm


class Presenter(QObject):
    """Connects ``session``'s signals to the widgets that show them.

    Args:
        active_form: the run form on top (where an input error goes).
        timing: the status bar label for the time an estimate and the background work took.
    """

    def __init__(
        self,
        session: Session,
        results: ResultsView,
        target_form: TargetForm,
        gpu_glue: GpuGlue,
        *,
        active_form: Callable[[], FieldForm],
        timing: QLabel,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.session = session
        self.results = results
        self.target_form = target_form
        self.gpu_glue = gpu_glue
        self._active_form = active_form
        self.timing = timing
        session.target_checked.connect(self._on_target_checked)
        session.problem.connect(self._on_problem)
        session.plan_ready.connect(self._on_plan)
        session.report_ready.connect(self._on_report)
        session.report_pending.connect(results.changes.set_busy)
        session.report_failed.connect(results.changes.clear)
        session.background_ready.connect(self._on_background)
        session.sweep_progress.connect(results.slots.show_sweep_progress)

    @property
    def unit(self) -> SizeUnit:
        return self.session.unit

    def redraw(self) -> None:
        """Draw the plan and the fit report on screen again (the unit changed)."""
        plan, rep = self.session.plan, self.session.report
        if plan is not None:
            self.draw_plan(plan)
        if rep is not None:
            self.results.show_report(self.session.report_view(rep), self.unit)

    def draw_plan(self, plan: Plan) -> None:
        if plan.verdict_error is not None:
            self.target_form.show_error("gpu", plan.verdict_error)
        self.results.show_plan(plan, self.unit, "no GPU target: " + self.target_form.error_text("gpu"))
        self.timing.setText(f"estimate {plan.estimate_ms:.1f} ms")

    def _on_target_checked(self, error: str | None) -> None:
        self.target_form.clear_errors()
        if error is not None:
            self.target_form.show_error("gpu", error)

    def _on_problem(self, problem: Problem) -> None:
        if problem.message is not None:
            self._active_form().show_error(problem.field, problem.message)
        self.results.mark_stale(problem.banner)

    def _on_plan(self, plan: Plan) -> None:
        try:
            self.draw_plan(plan)
            self.gpu_glue.show_plan(plan)
        except Exception as e:  # a bug must not take the window down; keep the last estimate
            self.results.mark_stale(f"unexpected error: {error_line(e)}")

    def _on_report(self, view: ReportView) -> None:
        try:
            self.results.show_report(view, self.unit)
        except Exception as e:  # never raise out of a slot
            self.results.changes.clear(f"could not show the fit report: {error_line(e)}")

    def _on_background(self, view: BackgroundView) -> None:
        try:
            self.results.show_background(view, self.unit)
            self.timing.setText(
                f"estimate {view.estimate_ms:.1f} ms · fit report + sweep {view.background_ms:.0f} ms"
            )
        except Exception as e:  # never raise out of a slot
            self.results.changes.clear(f"could not show the fit report: {error_line(e)}")
