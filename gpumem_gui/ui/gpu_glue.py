"""The glue between the GPU panel, the target form and the session.

GPU readings come from the poller: each one is recorded in the panel's history at once and drawn at most
every ``min_interval_ms`` (a throttle, qutebrowser-style: the newest reading wins; without it a fast poll,
``--poll-ms 50`` with 8 GPUs, costs more GUI time per reading than the interval and the queued readings pile
up). A drawn reading goes to the session (which may make a local GPU the target, or recompute for new free
memory) and to the target form's list of local GPUs. A click on a card makes that GPU the target; the panel's
free/total switch sets the basis of the check. A failed reading is a state the panel shows, never a crash.
The panel's cluster source has its own glue, :attr:`GpuGlue.cluster` (:mod:`~gpumem_gui.ui.cluster_glue`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QSettings, QTimer, Slot

from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui.cluster_glue import ClusterGlue
from gpumem_gui.ui.gpu_panel import GpuPanel
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.plan import Plan
from gpumem_gui.ui.session import Session
from gpumem_gui.ui.target_form import TargetForm

# GPU readings are drawn at most this often, whatever the poll interval (every reading is still recorded)
SNAPSHOT_MIN_INTERVAL_MS = 250


class GpuGlue(QObject):
    """Connects ``panel`` and ``target_form`` to ``session`` (see module docstring).

    Args:
        guard: runs a slot's body, turning an error into a message.
        status: shows a one-line message for some milliseconds (the status bar's ``showMessage``).
        settings: where the panel's source and the cluster connection are kept.
    """

    def __init__(
        self,
        panel: GpuPanel,
        target_form: TargetForm,
        session: Session,
        *,
        guard: Callable[[Callable[[], object]], None],
        status: Callable[[str, int], None],
        min_interval_ms: int = SNAPSHOT_MIN_INTERVAL_MS,
        settings: QSettings | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.panel = panel
        self.target_form = target_form
        self.session = session
        self._status = status
        self._min_interval_ms = min_interval_ms
        self._pending: GpuSnapshot | None = None
        self._shown_at: float | None = None  # time.monotonic() of the last drawn reading
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._show_pending)
        panel.set_evaluator(session.evaluate_device)
        panel.target_selected.connect(lambda key: guard(lambda: self._on_card_clicked(key)))
        panel.basis_changed.connect(lambda basis: guard(lambda: self._on_basis_changed(basis)))
        self.cluster = ClusterGlue(
            panel,
            session,
            target_form,
            settings if settings is not None else QSettings(),
            guard=guard,
            parent=self,
        )

    @Slot(object)
    def on_snapshot(self, snap: GpuSnapshot) -> None:
        """A new reading: recorded at once; drawn at once unless one was drawn less than the interval ago,
        else when that interval is over (only the newest reading waiting by then is drawn)."""
        try:
            self.panel.record(snap)
            self._pending = snap
            if self._timer.isActive():
                return
            since = None if self._shown_at is None else time.monotonic() - self._shown_at
            wait_ms = 0 if since is None else self._min_interval_ms - since * 1000
            if wait_ms <= 0:
                self._show_pending()
            else:
                self._timer.start(max(1, round(wait_ms)))
        except Exception as e:  # never raise out of a slot
            self._status(f"GPU reading not shown: {error_line(e)}", 10000)

    def _show_pending(self) -> None:
        snap, self._pending = self._pending, None
        if snap is None:
            return
        self._shown_at = time.monotonic()
        try:
            self._draw(snap)
        except Exception as e:  # never raise out of a slot
            self._status(f"GPU reading not shown: {error_line(e)}", 10000)

    def _draw(self, snap: GpuSnapshot) -> None:
        update = self.session.take_snapshot(snap, self.target_form.value())
        self.target_form.set_local_devices(update.usable)
        self.panel.show_snapshot(snap, record=False)  # on_snapshot recorded it
        if update.auto_target is not None:
            self.target_form.set_value(update.auto_target)

    @Slot(str)
    def on_gpu_error(self, reason: str) -> None:
        self.panel.show_error(reason)

    def show_plan(self, plan: Plan) -> None:
        """Select the target's first local or cluster GPU and check the new plan against every card."""
        devices = plan.target.devices if plan.target else ()
        cluster = plan.target is not None and plan.target.cluster
        self.panel.set_selected(devices[0] if devices and not cluster else None)
        self.panel.cluster.set_target(devices[0] if devices and cluster else None)
        self.panel.refresh_verdicts()

    def _on_card_clicked(self, key: str) -> None:
        current = self.target_form.value()
        self.target_form.set_value(current.model_copy(update={"kind": "local", "device": key, "count": 1}))
        self.session.target_user_set = True
        self.session.recompute_now()

    def _on_basis_changed(self, basis: str) -> None:
        self.target_form.set_basis("free" if basis == "free" else "total")
        self.session.recompute_now()

    def shutdown(self) -> None:
        self._timer.stop()
        self.cluster.shutdown()
