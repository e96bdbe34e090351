"""The glue between the run side of the window and the session.

An edit in a form restarts the session's debounce (short for a step or a pick, longer while typing); an edit
of the GPU target also marks the target as chosen (the first GPU reading no longer replaces it). A preset, a
switch between the Inference and Training tabs, a ranked change applied from the results, or another sweep
axis recompute at once. Every slot body runs under the window's ``guard``: nothing raises out of a slot.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject

from gpumem_gui.core import LoadedModel, TaskHead
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.plan import apply_update
from gpumem_gui.ui.results import ResultsView
from gpumem_gui.ui.run_panel import RunPanel
from gpumem_gui.ui.scenario import Scenario
from gpumem_gui.ui.session import Session


class FormGlue(QObject):
    """Connects ``panel`` (forms, presets, tabs) and the results' requests to ``session``.

    Args:
        guard: runs a slot's body, turning an error into a message.
        notify: tells the user (title, text).
        show_model: shows the model with a new task head (the model panel's counts).
    """

    def __init__(
        self,
        panel: RunPanel,
        results: ResultsView,
        session: Session,
        *,
        guard: Callable[[Callable[[], object]], None],
        notify: Callable[[str, str], None],
        show_model: Callable[[LoadedModel], None] = lambda _m: None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.panel = panel
        self.results = results
        self.session = session
        self._notify = notify
        self._show_model = show_model
        self.loaded: LoadedModel | None = None  # the model as opened, before the task head form's head
        panel.run_form.changed.connect(lambda: session.schedule(panel.run_form.typing))
        panel.train_form.changed.connect(lambda: session.schedule(panel.train_form.typing))
        panel.target_form.changed.connect(self._on_target_edited)
        panel.task_form.changed.connect(lambda: guard(self._on_task_edited))
        panel.mode_tabs.currentChanged.connect(lambda _i: guard(self._on_mode_changed))
        panel.presets.activated.connect(lambda i: guard(lambda: self._on_preset(i)))
        panel.train_presets.activated.connect(lambda i: guard(lambda: self._on_training_preset(i)))
        results.apply_requested.connect(lambda upd: guard(lambda: self.apply_change(upd)))
        results.sweep_over_changed.connect(lambda over: guard(lambda: session.set_sweep_over(over)))
        session.plan_ready.connect(lambda plan: guard(lambda: panel.calibration_row.show_plan(plan)))
        panel.calibration_row.removed.connect(lambda _name: guard(session.recompute_now))

    def open_model(self, m: LoadedModel, scenario: Scenario | None) -> None:
        """A model was opened: the forms take its weight format (its own, else the one chosen) and its task
        head, or the ``scenario``'s settings; the session gets it with that head."""
        self.panel.note_chosen_weights(self.session.model)  # read before the forms change
        self.loaded = m
        self.panel.set_file_weights_available(m.weights is not None)
        self.panel.show_task_head(m.spec)
        self.panel.offer_fields_of(m.spec)  # images only for a model that takes them
        if scenario is not None:
            self.panel.apply_scenario(scenario)
        else:
            self.panel.adopt_weights(m)
        self.session.set_model(m.with_task(self.panel.task_head() or TaskHead()))

    def _on_task_edited(self) -> None:
        """The encoder's task head changed: the session's model carries the new head (a bad value shows next
        to its field and keeps the last good model)."""
        head = self.panel.task_head()
        if self.loaded is None or head is None:
            return
        model = self.loaded.with_task(head)
        self.session.set_model(model)
        self._show_model(model)
        self.session.schedule(self.panel.task_form.typing)

    def _on_target_edited(self) -> None:
        self.session.target_user_set = True
        self.session.schedule(self.panel.target_form.typing)

    def _on_preset(self, index: int) -> None:
        if self.panel.apply_preset(index):
            self.session.recompute_now()

    def _on_training_preset(self, index: int) -> None:
        if self.panel.apply_training_preset(index):
            self.session.recompute_now()

    def _on_mode_changed(self) -> None:
        self.results.set_mode(self.panel.mode)
        self.session.drop_report()
        self.session.recompute_now()

    def apply_change(self, update: dict) -> None:
        """Apply one of the ranked changes to the run form (and the GPU count when it needs more GPUs)."""
        try:
            run = self.session.run if self.session.run is not None else self.panel.active_form.value()
            run = apply_update(run, update)
        except Exception as e:
            self._notify("gpumem", f"cannot apply that change: {error_line(e)}")
            return
        self.panel.apply_run(run)
        self.session.recompute_now()
