"""Clicking a GPU card in the cluster view makes it the chart's target (issue 33 item 3), as a click on a
local card does: the target form names it, the plan is checked against its memory now, its card is framed,
and a new cluster reading of it recomputes."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest

from gpumem_gui.core import GpumemInputError, SizeUnit
from gpumem_gui.ui.cluster_view import ClusterView
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.target_form import GpuChoice, resolve_target
from tests.test_ui_cluster import GiB, StaticBackend, mixed, snapshot, tight

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]


def _click(view: ClusterView, key: str) -> None:
    index = view.model.index_of(key)
    assert index.isValid(), key
    view.tree.scrollTo(index)
    rect = view.tree.visualRect(index)
    QTest.mouseClick(view.tree.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(rect.center()))


def test_a_clicked_cluster_card_becomes_the_target(main_window: MainWindow, qtbot) -> None:
    w, backend = main_window, StaticBackend(tight())
    glue, view = w.gpu_glue.cluster, w.gpu_panel.cluster
    glue.use_cluster(backend, {"url": "http://test"})
    qtbot.waitUntil(lambda: view.model.index_of("node-b/2").isValid(), timeout=10000)
    margin = w.target_form.value().margin_mib
    with qtbot.waitSignal(w.estimate_updated, timeout=3000):
        _click(view, "node-b/2")
    choice = w.target_form.value()
    assert (choice.kind, choice.device, choice.count, choice.margin_mib) == ("cluster", "node-b/2", 1, margin)
    assert w.target_form.widget("gpu").currentText().strip() == "cluster GPU node-b/2"
    plan = w.session.plan
    assert plan is not None and plan.target is not None and plan.verdicts
    card = tight().device("node-b/2")
    assert card is not None and card.cuda_total_bytes is not None
    cuda = f"{card.cuda_total_bytes / GiB:.2f} GiB each as CUDA reports it, 80.00 GiB in nvidia-smi"
    assert plan.target.text.startswith(f"cluster GPU node-b/2: NVIDIA H100 80GB HBM3 ({cuda}")
    assert plan.target.target.cuda_capacity == card.cuda_total_bytes  # the figure the engines read
    assert (plan.target.target.capacity_bytes, plan.free_now) == (80 * GiB, 70 * GiB)
    assert all(v.fits for v in plan.verdicts)  # Llama-3.1-8B (~17 GiB) in node-b GPU 2's 70 GiB free
    m = view.model
    assert m.node(m.index_of("node-b/2")).target and m.line(m.node(m.index_of("node-b/2"))).endswith("target")

    _click(view, "node-b")  # a host row is no target: nothing changes
    assert w.target_form.value().device == "node-b/2"

    with qtbot.waitSignal(w.estimate_updated, timeout=3000):
        _click(view, "node-a/0")  # 4 GiB free: the plan does not fit there
    plan = w.session.plan
    assert plan is not None and plan.free_now == 4 * GiB and not all(v.fits for v in plan.verdicts)
    assert [n.key for n in m.nodes if n.target] == ["node-a/0"]
    assert w.target_form.widget("gpu").findText("    cluster GPU node-b/2") < 0  # one cluster entry

    freed = snapshot(
        *(
            d.model_copy(update={"free_bytes": 60 * GiB}) if d.key == "node-a/0" else d
            for d in tight().devices
        )
    )
    backend.snap = freed
    glue.on_snapshot(freed)  # a new reading of the target's GPU recomputes against it
    qtbot.waitUntil(lambda: w.session.plan is not None and w.session.plan.free_now == 60 * GiB, timeout=5000)
    assert all(v.fits for v in w.session.plan.verdicts)


def test_a_cluster_target_resolves_on_its_host_or_says_why_not() -> None:
    """A cluster choice takes the GPUs of the clicked card's host only; a card gone, a stale one, MIG mode or
    no cluster reading is one line for the target field."""
    unit = SizeUnit.GIB
    two = GpuChoice(kind="cluster", device="node-b/2", count=2)
    r = resolve_target(two, None, unit, tight())
    assert r.cluster and r.devices == ("node-b/0", "node-b/2") and r.target.count == 2
    with pytest.raises(GpumemInputError, match="only 4 cluster GPU\\(s\\) on node-b, not 5"):
        resolve_target(two.model_copy(update={"count": 5}), None, unit, tight())
    with pytest.raises(GpumemInputError, match="no cluster reading now"):
        resolve_target(two, None, unit, None)
    with pytest.raises(GpumemInputError, match="not in the latest cluster reading"):
        resolve_target(two.model_copy(update={"device": "node-z/0"}), None, unit, tight())
    with pytest.raises(GpumemInputError, match="stale"):
        resolve_target(two.model_copy(update={"device": "node-c/0"}), None, unit, tight())
    with pytest.raises(
        GpumemInputError, match="MIG mode: pick one of its MIG instances \\(node-b/0:0, node-b/0:1\\)"
    ):
        resolve_target(two.model_copy(update={"device": "node-b/0", "count": 1}), None, unit, mixed())
    mig = resolve_target(GpuChoice(kind="cluster", device="node-b/0:1"), None, unit, mixed())
    assert mig.devices == ("node-b/0:1",) and mig.target.capacity_bytes == 40 * GiB
