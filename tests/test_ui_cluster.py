"""The GPU panel's cluster view: hosts of GPU cards from cluster snapshots built here (no server), the fit
banner for the plan on screen, the source switch and its settings, faults as states, and the work a
1,000-GPU update costs (counted, never timed). The test against a real Prometheus lives elsewhere."""

from __future__ import annotations

import socket
import time

import pytest
from PySide6.QtCore import QModelIndex
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QDialogButtonBox

from gpumem_gui.core import Verdict
from gpumem_gui.hardware import FakeBackend, GpuDevice, GpuSnapshot
from gpumem_gui.ui.cluster_delegate import ClusterDelegate
from gpumem_gui.ui.cluster_dialog import SOURCE_KEY, ClusterDialog
from gpumem_gui.ui.cluster_glue import CLUSTER_POLL_MS
from gpumem_gui.ui.cluster_model import ClusterModel
from gpumem_gui.ui.cluster_view import ClusterView
from gpumem_gui.ui.gpu_poller import PollerController
from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def gpu(
    host: str, i: int, free_gib: float, *, total_gib: int = 80, stale: bool = False, age: float = 3.0, **kw
):
    total, free = total_gib * GiB, int(free_gib * GiB)
    return GpuDevice(
        index=i, name=H100, host=host, total_bytes=total, free_bytes=free, used_bytes=total - free,
        utilization_percent=50, temperature_c=60, stale=stale, sample_age_s=age, **kw,
    )  # fmt: skip


def snapshot(*devices: GpuDevice, notes: tuple[str, ...] = ()) -> GpuSnapshot:
    return GpuSnapshot(taken_at=time.time(), backend="prometheus:http://test", devices=devices, notes=notes)


def mixed() -> GpuSnapshot:
    """node-a: two GPUs, GPU 1 lost; node-b: GPU 0 in MIG mode with two instances, GPU 1; node-c: stale."""
    return snapshot(
        gpu("node-a", 0, 70),
        GpuDevice(index=1, name=H100, host="node-a", error="lost: no samples since the last scrape"),
        gpu("node-b", 0, 80, mig_mode=True),
        gpu("node-b", 0, 30, total_gib=40, is_mig_instance=True, parent_index=0),
        gpu("node-b", 1, 40, total_gib=40, is_mig_instance=True, parent_index=0),
        gpu("node-b", 1, 10),
        gpu("node-c", 0, 80, stale=True, age=42.4),
        gpu("node-c", 1, 80, stale=True, age=50.0),
        notes=("listing cut at 4096 GPUs",),
    )


def big(hosts: int = 125, per: int = 8, bump: str | None = None) -> GpuSnapshot:
    devices = [gpu(f"node-{h:03d}", i, (h * 7 + i * 13) % 80) for h in range(hosts) for i in range(per)]
    if bump is not None:
        devices = [
            d.model_copy(update={"free_bytes": d.free_bytes - GiB}) if d.key == bump else d for d in devices
        ]
    return snapshot(*devices)


class Counting:
    """An evaluator that needs ``need`` bytes and counts its calls."""

    def __init__(self, need: int = 20 * GiB) -> None:
        self.need, self.calls = need, 0

    def __call__(self, d: GpuDevice, available: int) -> Verdict:
        self.calls += 1
        head = available - self.need
        return Verdict(
            gpu_index=d.index, role="GPU", needed_bytes=self.need, available_bytes=available, margin_bytes=0,
            fits=head >= 0, headroom_bytes=head,
        )  # fmt: skip


class CountingDelegate(ClusterDelegate):
    paints = 0

    def paint(self, painter, option, index) -> None:
        CountingDelegate.paints += 1
        super().paint(painter, option, index)


class StaticBackend:
    """A GPU backend that returns one snapshot (what a cluster would report), for the real poller."""

    name = "static-cluster"

    def __init__(self, snap: GpuSnapshot) -> None:
        self.snap = snap

    def snapshot(self) -> GpuSnapshot:
        return self.snap

    def close(self) -> None:
        """Holds nothing to release."""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(model: ClusterModel, parent: QModelIndex | None = None) -> list[str]:
    parent = parent or QModelIndex()
    return [model.node(model.index(r, 0, parent)).key for r in range(model.rowCount(parent))]


# ---- the model and the delegate ----------------------------------------------------------------------------


def test_hosts_group_their_gpus_with_mig_under_the_gpu_stale_and_lost(qtbot) -> None:
    view = ClusterView()
    qtbot.addWidget(view)
    ev = Counting()
    view.sync(ev, "free", view.model.unit)
    view.show_snapshot(mixed())
    m = view.model
    assert rows(m) == ["node-a", "node-b", "node-c"]
    a, b, c = (m.index(r, 0) for r in range(3))
    assert rows(m, a) == ["node-a/0", "node-a/1"] and rows(m, b) == ["node-b/0", "node-b/1"]
    assert rows(m, m.index(0, 0, b)) == ["node-b/0:0", "node-b/0:1"]
    assert "lost: no samples" in m.data(m.index(1, 0, a))
    assert m.data(c) == "node-c · 2 GPUs · stale, last sample 42 s ago"
    assert view.header.text() == "6 GPUs on 3 hosts · 1 host stale · prometheus:http://test"
    assert view.notes.text() == "listing cut at 4096 GPUs" and not view.notes.isHidden()
    verdict = {
        k: m.verdict(m.node(m.index_of(k))) for k in ("node-a/0", "node-a/1", "node-b/0", "node-b/0:1")
    }
    assert verdict["node-a/0"].fits and verdict["node-b/0:1"].fits  # an instance is checked on its own
    assert verdict["node-a/1"] is None and verdict["node-b/0"] is None  # lost; a MIG parent
    assert m.verdict(m.node(m.index_of("node-c/0"))) is None  # stale: never placed, never checked
    view.sync(ev, "total", m.unit)  # against the total: node-b GPU 1 (10 of 80 GiB free) now holds 20 GiB
    assert m.verdict(m.node(m.index_of("node-b/1"))).fits
    calls = ev.calls
    view.sync(ev, "free", m.unit)
    view.resize(420, 900)
    view.show()
    qtbot.waitExposed(view)
    view.show_fit(None, "Cannot place the plan: test")
    assert not view.grab().isNull()  # every kind of row painted (an exception here fails the test)
    assert ev.calls == calls + len({"node-a/0", "node-b/0:0", "node-b/0:1", "node-b/1"})  # once each, cached


def test_a_changed_gpu_emits_data_changed_for_its_row_only(qtbot) -> None:
    model = ClusterModel()
    model.update(big(4, 8))
    seen: list[tuple[str, str]] = []
    model.dataChanged.connect(lambda a, b: seen.append((model.node(a).key, model.node(b).key)))
    resets: list[int] = []
    model.modelReset.connect(lambda: resets.append(1))
    assert model.update(big(4, 8, bump="node-002/5")) == 1
    assert seen == [("node-002/5", "node-002/5")] and not resets
    aged = snapshot(
        *(d.model_copy(update={"sample_age_s": 9.0}) for d in big(4, 8, bump="node-002/5").devices)
    )
    seen.clear()
    assert model.update(aged) == 0 and seen == []  # a fresh GPU's sample age is not shown: no change
    model.update(big(5, 8))  # a new host: the tree is rebuilt
    assert resets == [1] and rows(model)[-1] == "node-004"


def test_a_thousand_gpus_paint_and_evaluate_only_the_rows_on_screen(qtbot) -> None:
    view = ClusterView()
    qtbot.addWidget(view)
    view.delegate = CountingDelegate(view.model, view.tree)
    view.tree.setItemDelegate(view.delegate)
    ev = Counting()
    view.sync(ev, "free", view.model.unit)
    view.resize(400, 700)
    view.show()
    qtbot.waitExposed(view)
    CountingDelegate.paints = 0
    view.show_snapshot(big())
    qtbot.waitUntil(lambda: CountingDelegate.paints > 0)
    on_screen = view.tree.viewport().height() // QFontMetrics(view.tree.font()).height() + 1  # rows >= 1 line
    assert len(view.model.nodes) == 1125
    # one verdict per GPU card painted, and only rows on screen painted: not 1,125 rows, not 1,000 verdicts
    assert 0 < ev.calls <= CountingDelegate.paints <= 2 * on_screen < len(view.model.nodes) // 10
    painted, calls = CountingDelegate.paints, ev.calls
    seen: list[int] = []
    view.model.dataChanged.connect(lambda a, b: seen.append(1))
    assert view.show_snapshot(big(bump="node-000/1")) == 1  # on screen
    qtbot.waitUntil(lambda: ev.calls == calls + 1)  # its verdict, worked out again when it is repainted
    assert seen == [1] and CountingDelegate.paints - painted <= 2
    painted, calls = CountingDelegate.paints, ev.calls
    assert view.show_snapshot(big(bump="node-100/1")) == 2  # off screen (and node-000/1 back, on screen)
    qtbot.waitUntil(lambda: ev.calls == calls + 1)
    qtbot.wait(50)  # time for any further repaint, which would be wrong
    assert ev.calls == calls + 1 and CountingDelegate.paints - painted <= 2


# ---- the window: the banner, the source switch, faults ---------------------------------------------------


def tight() -> GpuSnapshot:
    """Only node-b GPU 2 has room for the default plan (Llama-3.1-8B, ~17 GiB); node-c is free but stale."""
    return snapshot(
        *(gpu("node-a", i, 4) for i in range(4)),
        *(gpu("node-b", i, 70 if i == 2 else 4) for i in range(4)),
        *(gpu("node-c", i, 80, stale=True, age=90) for i in range(4)),
    )


def test_the_banner_places_the_plan_on_screen_and_highlights_its_gpus(main_window: MainWindow, qtbot) -> None:
    w, backend = main_window, StaticBackend(tight())
    glue, view = w.gpu_glue.cluster, w.gpu_panel.cluster
    glue.use_cluster(backend, {"url": "http://test"})
    assert w.gpu_panel.pages.currentWidget() is view and glue.polling
    assert glue.poll_interval_ms == CLUSTER_POLL_MS == 2000
    qtbot.waitUntil(lambda: view.banner.text().startswith("Fits"), timeout=10000)
    assert view.banner.text() == "Fits now on node-b GPU 2"
    m = view.model
    assert [n.key for n in m.nodes if n.rank is not None] == ["node-b/2"]
    assert m.data(m.index_of("node-b")) == "node-b · 4 GPUs"
    view.show_button.click()  # scrolls the best placement into view
    assert view.tree.viewport().rect().contains(view.tree.visualRect(m.index_of("node-b/2")).topLeft())
    full = snapshot(
        *(d.model_copy(update={"free_bytes": 4 * GiB}) if d.key == "node-b/2" else d for d in tight().devices)
    )
    backend.snap = full
    glue.on_snapshot(full)
    qtbot.waitUntil(lambda: view.banner.text().startswith("Does not fit"), timeout=10000)
    assert view.banner.text().startswith("Does not fit anywhere now: no GPU has")
    assert all(n.rank is None for n in m.nodes) and not view.show_button.isEnabled()
    with qtbot.waitSignal(w.estimate_updated, timeout=3000):  # the window keeps working
        w.run_form.widget("batch").setValue(2)


def test_the_cluster_fit_applies_a_saved_calibration_of_its_gpu_model(main_window: MainWindow, qtbot) -> None:
    """The saved calibration for the cluster's GPU model applies to the placements (as in gpumem fit
    --prometheus); the banner's tooltip names it; removing it from the store redoes the fit without it."""
    from datetime import date

    from gpumem_gui.calibration_store import CalibrationStore
    from gpumem_gui.core import calibration_from
    from gpumem_gui.core.observed import ObservedMemory

    oom = ObservedMemory(source_format="torch_oom", total_bytes=80 * GiB, process_bytes=60 * GiB,
                         allocated_bytes=55 * GiB, reserved_unallocated_bytes=2 * GiB)  # fmt: skip
    store = CalibrationStore()
    store.save(calibration_from((oom,), None, name="team", gpu_name=H100, measured_on=date(2026, 12, 7)))
    w, view = main_window, main_window.gpu_panel.cluster
    w.gpu_glue.cluster.use_cluster(StaticBackend(tight()), {"url": "http://test"})
    qtbot.waitUntil(lambda: view.fit is not None, timeout=10000)
    assert view.fit.calibrations == ("team",) and "team" in view.banner.toolTip()
    store.remove("team")
    w.run_form.widget("batch").setValue(2)
    qtbot.waitUntil(lambda: view.fit is not None and view.fit.calibrations == (), timeout=10000)
    assert view.banner.toolTip() == ""


def test_choosing_the_cluster_asks_for_the_server_and_the_choice_is_kept(
    main_window: MainWindow, qtbot
) -> None:
    w = main_window
    glue, panel, settings = w.gpu_glue.cluster, w.gpu_panel, w.settings
    panel.source.activated.emit(1)  # "Cluster (Prometheus)" picked, nothing saved yet: the dialog asks
    assert glue.dialog is not None and glue.dialog.isVisible()
    glue.dialog.reject()  # cancelled: still this machine
    assert glue.source == "local" and panel.source.currentIndex() == 0 and settings.value(SOURCE_KEY) is None
    panel.source.activated.emit(1)
    dialog = glue.dialog
    assert dialog is not None and dialog.isVisible()
    url = f"http://127.0.0.1:{closed_port()}"
    dialog.edits["url"].setText(url)
    dialog.edits["selector"].setText('{cluster="a"}')
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert glue.source == "cluster" and glue.polling
    assert settings.value(SOURCE_KEY) == "cluster" and settings.value("cluster/url") == url
    assert settings.value("cluster/selector") == '{cluster="a"}'
    # the server is down: a state on the cluster page, with the reason
    qtbot.waitUntil(lambda: not panel.cluster.reason.isHidden(), timeout=10000)
    assert url in panel.cluster.reason.text() and "This machine" in panel.cluster.reason.text()
    assert panel.cluster.header.text().startswith("No cluster data")
    panel.source.activated.emit(0)  # back to this machine
    assert glue.source == "local" and not glue.polling and panel.pages.currentIndex() == 0
    assert settings.value(SOURCE_KEY) == "local"
    glue.restore()  # the saved choice: this machine
    assert glue.source == "local"
    settings.setValue(SOURCE_KEY, "cluster")
    glue.restore()  # the saved choice: the cluster, with the saved connection and no dialog
    assert glue.source == "cluster" and glue.polling and panel.source.currentIndex() == 1
    glue.choose("local")


def test_a_bad_field_stays_in_the_dialog_as_one_line(qtbot, tmp_path) -> None:
    dialog = ClusterDialog({"url": "ftp://prometheus"})
    qtbot.addWidget(dialog)
    dialog.open()
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    ok.click()
    assert dialog.isVisible() and dialog.backend is None
    assert "url" in dialog.error.text() and "http" in dialog.error.text() and "\n" not in dialog.error.text()
    dialog.edits["url"].setText("http://prometheus:9090")
    dialog.edits["token_file"].setText(str(tmp_path / "missing-token"))
    ok.click()
    assert (
        dialog.isVisible() and "token_file" in dialog.error.text() and "missing-token" in dialog.error.text()
    )
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    dialog.edits["token_file"].setText(str(token))
    ok.click()
    assert not dialog.isVisible() and dialog.backend is not None
    assert dialog.values()["token_file"] == str(token)  # the path is kept, not the token
    dialog.backend.close()


def test_the_local_poller_stops_while_the_cluster_is_shown(main_window: MainWindow, qtbot) -> None:
    w = main_window
    glue = w.gpu_glue.cluster
    local = PollerController(FakeBackend("rtx4090_browser", cuda_visible_devices=None), interval_ms=50)
    local.poller.snapshot_ready.connect(w.on_snapshot)
    try:
        glue.attach_local(local)
        assert local.thread_running
        qtbot.waitUntil(lambda: len(w.gpu_panel.cards) == 1, timeout=5000)
        glue.use_cluster(StaticBackend(tight()), {"url": "http://test"})
        assert not local.thread_running and glue.polling
        qtbot.waitUntil(lambda: len(w.gpu_panel.cluster.model.nodes) == 15, timeout=5000)
        glue.choose("local")
        assert local.thread_running and not glue.polling
        polls = local.poller.polls
        qtbot.waitUntil(lambda: local.poller.polls > polls, timeout=5000)
    finally:
        local.shutdown()


def test_the_window_reads_a_real_prometheus(main_window: MainWindow, qtbot, fresh_cluster) -> None:
    """The whole path in the window: the dialog's connection, the real server over loopback, the recorded
    hosts grouped with their MIG instances, and the banner for the plan on screen."""
    w = main_window
    glue, panel = w.gpu_glue.cluster, w.gpu_panel
    panel.source.activated.emit(1)
    dialog = glue.dialog
    assert dialog is not None
    dialog.edits["url"].setText(fresh_cluster.url)
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    view = panel.cluster
    qtbot.waitUntil(lambda: view.model.index_of("node-c/0:0").isValid(), timeout=15000)
    for host in fresh_cluster.hosts:
        assert view.model.index_of(host).isValid()
    qtbot.waitUntil(lambda: view.banner.text().startswith(("Fits", "Does not fit")), timeout=15000)
    assert view.reason.isHidden()
    glue.choose("local")
