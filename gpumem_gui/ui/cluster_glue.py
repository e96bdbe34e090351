"""The GPU panel's source: this machine (the app's NVML or fake poller) or a cluster read from Prometheus.

Choosing "Cluster (Prometheus)" uses the saved connection, or asks for one (:class:`ClusterDialog`); the
local poller (when the app attached it) stops, and a poller on the cluster backend starts, polling every 2 s.
Choosing "This machine" retires the cluster poller and starts the local one again. A retired poller whose
poll is still in flight (a slow server) is finished when its thread ends, never waited for in the GUI thread
for long; its late readings are dropped. The choice and the connection (file paths only) are kept in the
settings.

Each cluster reading goes to the panel's cluster page; with the plan on screen, the core's ``cluster_fit`` of
that plan over the reading's usable GPUs runs on a :class:`~gpumem_gui.ui.workers.BackgroundRunner` (5-16 ms
for inference on 1,000 GPUs, a training step's replay for training) and its summary becomes the banner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, QSettings, Qt, Signal, Slot

from gpumem_gui.calibration_store import CalibrationStore
from gpumem_gui.core import ClusterFit, GpumemInputError, cluster_fit
from gpumem_gui.hardware import GpuBackend, PrometheusBackend
from gpumem_gui.hardware.cluster import cluster_gpus
from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui.cluster_dialog import (
    ClusterDialog,
    make_backend,
    save_connection,
    save_source,
    saved_connection,
    saved_source,
)
from gpumem_gui.ui.gpu_panel import GpuPanel
from gpumem_gui.ui.gpu_poller import PollerController
from gpumem_gui.ui.session import Session
from gpumem_gui.ui.target_form import TargetForm
from gpumem_gui.ui.workers import BackgroundRunner

# issue 17: the cluster is polled every 2 s, not faster. dcgm-exporter collects every 30 s by default (its
# -c/--collect-interval flag, default 30000 ms, NVIDIA/dcgm-exporter pkg/cmd/app.go) and Prometheus scrapes
# every 1 min by default (15 s in its example config), so a faster poll only loads the server.
CLUSTER_POLL_MS = 2000
# a source switch waits this long for the old cluster poller in the GUI thread; a slower one is reaped later
SWITCH_WAIT_MS = 200


class _Feed(QObject):
    """Relays one cluster poller's signals into the GUI thread while it is the live source."""

    snapshot = Signal(object)
    error = Signal(str)

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.live = True

    @Slot(object)
    def on_snapshot(self, snap: GpuSnapshot) -> None:
        if self.live:
            self.snapshot.emit(snap)

    @Slot(str)
    def on_error(self, reason: str) -> None:
        if self.live:
            self.error.emit(reason)


@dataclass
class _Cluster:
    controller: PollerController
    backend: GpuBackend
    feed: _Feed

    @property
    def poll_ms(self) -> int:
        """The longest a poll may take: Prometheus' request timeout and a second (else 5 s)."""
        timeout_s = self.backend.cfg.timeout_s if isinstance(self.backend, PrometheusBackend) else 5.0
        return int(timeout_s * 1000) + 1000


class ClusterGlue(QObject):
    """Switches the GPU panel's source and keeps the cluster page and its fit banner up to date."""

    def __init__(
        self,
        panel: GpuPanel,
        session: Session,
        target_form: TargetForm,
        settings: QSettings,
        *,
        guard: Callable[[Callable[[], object]], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.panel, self.view = panel, panel.cluster
        self.session, self.target_form, self.settings = session, target_form, settings
        self.source = "local"
        self._guard = guard
        self.dialog: ClusterDialog | None = None
        self._local: PollerController | None = None
        self._cluster: _Cluster | None = None
        self._retiring: list[_Cluster] = []
        self._snap: GpuSnapshot | None = None
        self._fit_inputs: tuple | None = None
        self.calibrations = CalibrationStore()  # the saved ones: each applies to its GPU model's GPUs
        self._runner = BackgroundRunner("cluster-fit", 1, self)
        self._runner.finished.connect(self._on_fit)
        self._runner.failed.connect(self._on_fit_failed)
        panel.source_changed.connect(lambda s: guard(lambda: self.choose(s)))
        panel.connection_requested.connect(lambda: guard(self.edit_connection))
        self.view.card_clicked.connect(lambda key: guard(lambda: self.target_card(key)))
        session.plan_ready.connect(lambda _plan: guard(self.schedule_fit))

    # ---- the source --------------------------------------------------------------------------------------

    def attach_local(self, controller: PollerController) -> None:
        """The app's poller of this machine: started now unless the cluster is shown; stopped while it is,
        started again after."""
        self._local = controller
        if self.source == "local" and not controller.thread_running:
            controller.start()

    def restore(self) -> None:
        """Show the source saved last time (a saved cluster that is down is a state, not a crash)."""
        if saved_source(self.settings) == "cluster" and saved_connection(self.settings)["url"]:
            self.choose("cluster")

    def choose(self, source: str) -> None:
        """'local' or 'cluster' (the saved connection, or the dialog when there is none or it is bad); the
        source on screen again changes nothing."""
        if source == self.source and (source == "local" or self._cluster is not None):
            return
        if source == "local":
            self.use_local()
            return
        values = saved_connection(self.settings)
        if not values["url"]:
            self.edit_connection()
            return
        try:
            backend = make_backend(values)
        except GpumemInputError as e:
            self.edit_connection(e.one_line())
            return
        self.use_cluster(backend, values)

    def edit_connection(self, error: str | None = None) -> ClusterDialog:
        """Open the connection dialog (window-modal, not blocking); Connect switches to the cluster."""
        dialog = ClusterDialog(saved_connection(self.settings), error, self.panel.window())
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # after its accepted/rejected signals
        dialog.accepted.connect(lambda: self._guard(lambda: self._on_dialog_accepted(dialog)))
        dialog.rejected.connect(lambda: self._guard(lambda: self.panel.show_source(self.source)))
        self.dialog = dialog
        dialog.open()
        return dialog

    def _on_dialog_accepted(self, dialog: ClusterDialog) -> None:
        if dialog.backend is not None:
            self.use_cluster(dialog.backend, dialog.values())

    def use_cluster(self, backend: GpuBackend, values: dict[str, str]) -> None:
        """Read the GPUs from ``backend`` (every 2 s) instead of this machine; saves the choice."""
        save_connection(self.settings, values)
        save_source(self.settings, "cluster")
        self._retire_cluster(SWITCH_WAIT_MS)
        if self._local is not None:
            self._local.shutdown()
        feed = _Feed(self)
        controller = PollerController(backend, CLUSTER_POLL_MS, self)
        controller.poller.snapshot_ready.connect(feed.on_snapshot)
        controller.poller.error.connect(feed.on_error)
        feed.snapshot.connect(self.on_snapshot)
        feed.error.connect(self.view.show_error)
        self._cluster = _Cluster(controller, backend, feed)
        self.source = "cluster"
        self._snap, self._fit_inputs = None, None
        self.view.show_fit(None)
        self.panel.show_source("cluster", backend.name)
        controller.start()

    def use_local(self) -> None:
        """Back to this machine's GPUs; saves the choice."""
        save_source(self.settings, "local")
        self._retire_cluster(SWITCH_WAIT_MS)
        self.source = "local"
        self.panel.show_source("local")
        if self._local is not None and not self._local.thread_running:
            self._local.start()

    @property
    def polling(self) -> bool:
        """Whether a cluster poller runs (tests)."""
        return self._cluster is not None and self._cluster.controller.thread_running

    @property
    def poll_interval_ms(self) -> int | None:
        """The cluster poller's interval (None: no cluster poller)."""
        return self._cluster.controller.poller.interval_ms if self._cluster is not None else None

    def target_card(self, key: str) -> None:
        """A cluster GPU card was clicked: it becomes the target (one GPU, the margin kept), as a local card
        does (:class:`~gpumem_gui.ui.gpu_glue.GpuGlue`)."""
        current = self.target_form.value()
        self.target_form.set_value(current.model_copy(update={"kind": "cluster", "device": key, "count": 1}))
        self.session.target_user_set = True
        self.session.recompute_now()

    # ---- readings and the fit ----------------------------------------------------------------------------

    @Slot(object)
    def on_snapshot(self, snap: GpuSnapshot) -> None:
        """A cluster reading: the cluster page shows it, and the plan is placed on it again."""
        self._snap = snap
        try:
            self.session.take_cluster_snapshot(snap)
            self.view.show_snapshot(snap)
            self.schedule_fit()
        except Exception as e:  # never raise out of a slot
            self.view.show_error(f"cluster reading not shown: {type(e).__name__}: {e}")

    def schedule_fit(self) -> None:
        """Place the plan on screen on the latest reading's usable GPUs (in the worker; skipped when neither
        the plan nor those GPUs changed)."""
        snap, model, plan = self._snap, self.session.model, self.session.plan
        if self.source != "cluster" or snap is None:
            return
        if not snap.available:
            self._fit_inputs = None
            self.view.show_fit(None, "No cluster data to place the plan on.")
            return
        if model is None or model.spec is None or plan is None:
            self.view.show_fit(None)
            return
        margin = self.target_form.value().margin_bytes
        cals = self.calibrations.fresh().calibrations
        inputs = (plan, margin, _placement_inputs(snap), cals)
        if self._fit_inputs is not None and _same_inputs(self._fit_inputs, inputs):
            return
        self._fit_inputs = inputs
        spec, run, weights = model.spec, plan.run, model.weights
        # cluster_gpus too runs in the worker: 1,000 GPUs take ~30 ms of pydantic models
        self._runner.submit(
            lambda: cluster_fit(spec, run, cluster_gpus(snap), margin, weights, calibrations=cals)
        )

    @Slot(int, object)
    def _on_fit(self, job_id: int, result: object) -> None:
        if job_id == self._runner.latest and self.source == "cluster" and isinstance(result, ClusterFit):
            self.view.show_fit(result)

    @Slot(int, str)
    def _on_fit_failed(self, job_id: int, message: str) -> None:
        if job_id == self._runner.latest and self.source == "cluster":
            self.view.show_fit(None, f"Cannot place the plan: {message}")

    def wait_fit(self, timeout_ms: int = 5000) -> bool:
        """Wait for the cluster fit in the worker (tests, the screenshot script); deliver it with events."""
        return self._runner.wait(timeout_ms)

    # ---- retiring pollers --------------------------------------------------------------------------------

    def _retire_cluster(self, wait_ms: int) -> None:
        c, self._cluster = self._cluster, None
        if c is None:
            return
        c.feed.live = False
        if c.controller.shutdown(wait_ms):
            self._dispose(c)
            return
        self._retiring.append(c)  # its poll is still in flight: finish it when its thread ends
        thread = c.controller.worker_thread
        if thread is not None:
            thread.finished.connect(self._reap)

    @Slot()
    def _reap(self) -> None:
        for c in [c for c in self._retiring if not c.controller.thread_running]:
            self._retiring.remove(c)
            c.controller.shutdown(0)
            self._dispose(c)

    @staticmethod
    def _dispose(c: _Cluster) -> None:
        with contextlib.suppress(Exception):  # closing a session must not stop a shutdown
            c.backend.close()
        c.feed.deleteLater()
        c.controller.deleteLater()

    def shutdown(self) -> None:
        """Stop the cluster poller (waiting for a poll in flight up to its request timeout) and the worker."""
        wait_ms = self._cluster.poll_ms if self._cluster is not None else SWITCH_WAIT_MS
        self._retire_cluster(wait_ms)
        for c in list(self._retiring):
            c.controller.shutdown(c.poll_ms)
        self._reap()
        self._runner.shutdown(5000)


def _placement_inputs(snap: GpuSnapshot) -> tuple:
    """What :func:`cluster_gpus` reads of a snapshot (cheap to build and compare, unlike its models)."""
    return tuple(
        (d.key, d.name, d.total_bytes, d.free_bytes, d.stale, d.ok, d.mig_mode) for d in snap.devices
    )


def _same_inputs(a: tuple, b: tuple) -> bool:
    """Same plan object, same margin, same GPUs, same saved calibrations."""
    return a[0] is b[0] and a[1:] == b[1:]
