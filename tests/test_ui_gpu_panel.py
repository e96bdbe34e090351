"""The GPU side panel, fed with FakeBackend snapshots directly (no poller, no NVML)."""

from __future__ import annotations

import pytest

from gpumem_gui.core.fit import GpuTarget, Verdict, verdicts
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.hardware import GpuDevice
from gpumem_gui.ui.gpu_panel import GpuPanel
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.target_form import GpuChoice

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

GiB = 1 << 30


def one_4090(used_mib: list[int]) -> dict:
    return {
        "at_end": "hold",
        "gpus": [
            {"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, "reserved_mib": 318, "used_mib": used_mib}
        ],
    }


def test_a_card_per_gpu_with_verdicts_from_the_evaluator(qtbot, fake_snapshots) -> None:
    panel = GpuPanel()
    qtbot.addWidget(panel)
    need = 60 * GiB

    def evaluator(d: GpuDevice, available: int) -> Verdict:
        return Verdict(
            gpu_index=0,
            role="GPU 0",
            needed_bytes=need,
            available_bytes=available,
            margin_bytes=0,
            fits=available >= need,
            headroom_bytes=available - need,
        )

    panel.set_evaluator(evaluator)
    snaps = fake_snapshots("8xh100_busy", steps=4)
    for s in snaps:
        panel.show_snapshot(s)
    last = snaps[-1]
    assert list(panel.cards) == [d.key for d in last.devices] and len(panel.cards) == 8
    for d in last.devices:
        words = panel.verdict_text(d.key)
        assert words.startswith("Fits" if d.free_bytes >= need else "Misses"), (d.key, words)
        assert words.endswith("(free now)")
    assert len(panel.history.series("0")) == 4
    panel.set_basis("total")  # every H100 holds 60 GiB when idle
    assert all(panel.verdict_text(k).startswith("Fits with") for k in panel.cards)
    assert all(panel.verdict_text(k).endswith("(CUDA's total)") for k in panel.cards)


def test_no_driver_shows_the_reason(qtbot, fake_snapshots) -> None:
    panel = GpuPanel()
    qtbot.addWidget(panel)
    (snap,) = fake_snapshots("no_driver")
    panel.show_snapshot(snap)
    assert not panel.cards
    assert "No NVIDIA driver" in panel.reason.text() and "catalog GPU" in panel.reason.text()


def test_a_lost_gpu_keeps_its_card_with_the_error(qtbot, fake_snapshots) -> None:
    panel = GpuPanel()
    qtbot.addWidget(panel)
    snaps = fake_snapshots("gpu_lost", steps=5)
    for s in snaps:
        panel.show_snapshot(s)
    assert len(panel.cards) == 2
    assert "lost" in panel.cards["1"].memory.text()
    assert "used" in panel.cards["0"].memory.text()


def test_mig_instances_get_their_own_cards(qtbot, fake_snapshots) -> None:
    panel = GpuPanel()
    qtbot.addWidget(panel)
    (snap,) = fake_snapshots("a100_mig")
    panel.show_snapshot(snap)
    assert [k for k in panel.cards if ":" in k] == ["0:0", "0:1", "0:2"]
    assert panel.cards["0:0"].title.text().startswith("MIG GPU 0:0")


def test_window_verdicts_change_with_the_plan_and_the_free_memory(
    main_window: MainWindow, fake_snapshots
) -> None:
    w = main_window
    roomy, crowded = fake_snapshots(one_4090([1024, 14000]), steps=2)
    w.on_snapshot(roomy)
    w.recompute_now()
    # the first reading makes the local GPU the target
    assert w.target_form.value().kind == "local" and w.target_form.value().device == "0"
    assert w.gpu_panel.verdict_text("0").startswith("Fits with")
    assert w.gpu_panel.verdict_text("0").endswith("(free now)")
    assert w.results.breakdown.free_line.isVisible()
    assert w.results.breakdown.free_line.value() == pytest.approx(roomy.devices[0].free_bytes / GiB)

    # the plan grows: 8 sequences of 16k tokens do not fit in 24 GB
    w.run_form.set_value(InferenceRun(batch=8, seq=16384, new_tokens=512))
    w.recompute_now()
    assert w.gpu_panel.verdict_text("0").startswith("Misses by")
    assert w.results.banner.state == "misses"

    # back to a small plan, then someone else takes 14 GB of the card
    w.run_form.set_value(InferenceRun(batch=1, seq=4096, new_tokens=512))
    w.recompute_now()
    assert w.gpu_panel.verdict_text("0").startswith("Fits")
    w.on_snapshot(crowded)
    w.recompute_now()
    assert w.gpu_panel.verdict_text("0").startswith("Misses")
    assert w.results.banner.state == "misses"

    # against the total memory it fits again
    w.gpu_panel.set_basis("total")
    assert w.gpu_panel.verdict_text("0").startswith("Fits with")
    assert w.gpu_panel.verdict_text("0").endswith("(CUDA's total)")
    assert w.results.banner.state == "fits"

    # the verdict on the card is the core's verdict for that device
    est = w.estimate
    dev = crowded.devices[0]
    expected = verdicts(
        est, GpuTarget(name="x", capacity_bytes=dev.total_bytes), w.target_form.value().margin_bytes
    )
    assert w.gpu_panel.cards["0"].bar.plan == expected[0].needed_bytes


def test_clicking_a_card_makes_it_the_target(main_window: MainWindow, fake_snapshots) -> None:
    w = main_window
    w.target_form.set_value(GpuChoice(gpu_id="RTX-4090"))
    w.session.target_user_set = True  # the user chose a catalog GPU: the first reading must not override it
    (snap,) = fake_snapshots("8xh100_busy")
    w.on_snapshot(snap)
    assert w.target_form.value().kind == "catalog"
    w.gpu_panel.cards["5"].clicked.emit("5")
    choice = w.target_form.value()
    assert choice.kind == "local" and choice.device == "5"
    assert w.gpu_panel.cards["5"].selected and not w.gpu_panel.cards["4"].selected
    capacity = snap.device("5").cuda_total_bytes  # the line is CUDA's total, what the verdict checks against
    assert capacity < snap.device("5").total_bytes
    assert w.results.breakdown.capacity_line.value() == pytest.approx(capacity / GiB)


def test_no_driver_window_works_against_a_catalog_gpu(main_window: MainWindow, fake_snapshots) -> None:
    w = main_window
    (snap,) = fake_snapshots("no_driver")
    w.on_snapshot(snap)
    w.recompute_now()
    assert w.target_form.value().kind == "catalog"
    assert w.results.banner.state in ("fits", "misses")
    assert "No NVIDIA driver" in w.gpu_panel.reason.text()
    w.target_form.set_value(GpuChoice(kind="local", device="0"))
    w.recompute_now()
    assert "no local GPU" in w.target_form.error_text("gpu")
    assert w.estimate is not None


def test_a_mig_gpu_is_targeted_through_its_instances(main_window: MainWindow, fake_snapshots) -> None:
    w = main_window
    (snap,) = fake_snapshots("a100_mig")
    w.on_snapshot(snap)
    w.recompute_now()
    choice = w.target_form.value()
    assert choice.kind == "local" and choice.device == "0:0"  # the first MIG instance, not the parent
    cuda = snap.device("0:0").cuda_total_bytes
    assert w.results.breakdown.capacity_line.value() == pytest.approx(cuda / GiB)
    w.gpu_panel.cards["0"].clicked.emit("0")
    assert "MIG mode" in w.target_form.error_text("gpu")


def test_readings_are_drawn_at_most_every_interval_newest_wins(
    qt_warnings_fail, qtbot, isolated_settings, fake_snapshots
) -> None:
    """A fast poll must not queue more GUI work than the interval allows: readings are recorded at once,
    drawn at most once per interval (the newest one), so the panel never falls behind the poller."""
    w = MainWindow(settings=isolated_settings, restore=False, dialogs=False, snapshot_interval_ms=300)
    qtbot.addWidget(w)
    first, second, third = fake_snapshots("8xh100_busy", steps=3)
    w.on_snapshot(first)  # nothing drawn yet: at once
    assert w.gpu_panel.snapshot is first
    w.on_snapshot(second)
    w.on_snapshot(third)
    assert w.gpu_panel.snapshot is first  # within the interval: waiting
    assert all(len(w.gpu_panel.history.series(d.key)) == 3 for d in third.devices)  # but recorded
    qtbot.waitUntil(lambda: w.gpu_panel.snapshot is third, timeout=3000)
    qtbot.wait(400)
    assert w.gpu_panel.snapshot is third  # the skipped reading is never drawn late
    w.shutdown()


def test_a_long_history_is_drawn_with_at_most_sparkline_points() -> None:
    import numpy as np

    from gpumem_gui.ui.gpu_panel import SPARKLINE_POINTS, sparkline_points

    xs = np.arange(6000, dtype=float) - 6000
    ys = np.full(6000, 10.0)
    ys[4321] = 70.0  # a one-reading spike
    ys[100:200] = np.nan  # a lost GPU
    dx, dy = sparkline_points(xs, ys)
    assert len(dx) == len(dy) == SPARKLINE_POINTS
    assert dx[-1] == xs[-1] and np.all(np.diff(dx) > 0)
    assert np.nanmax(dy) == 70.0  # the spike survives
    assert np.isnan(dy).sum() >= 1  # the gap too
    short_x, short_y = sparkline_points(xs[:50], ys[:50])
    assert np.array_equal(short_x, xs[:50]) and np.array_equal(short_y, ys[:50], equal_nan=True)
