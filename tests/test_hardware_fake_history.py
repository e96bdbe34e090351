"""MemoryHistory over FakeBackend snapshots, and the JSON/text reports."""

from __future__ import annotations

import pytest

from gpumem_gui.hardware import (
    FakeBackend,
    GpuDevice,
    GpuSnapshot,
    MemoryHistory,
    format_snapshot,
    snapshot_to_json,
)
from tests.fake_scenarios import MiB, one_gpu


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# ---- history ----------------------------------------------------------------------------------------------


def clocked(scenario: str | dict, times: list[float]) -> FakeBackend:
    it = iter(times)
    return FakeBackend(scenario, clock=lambda: next(it), cuda_visible_devices=None)


def test_history_keeps_max_age() -> None:
    b = clocked(one_gpu(used_mib=[1, 2, 3, 4, 5]), [0.0, 100.0, 200.0, 300.0, 400.0])
    h = MemoryHistory(max_age_s=250)
    for _ in range(5):
        h.add(b.snapshot())
    assert h.keys() == ["0"]
    assert h.series("0") == ((200.0, 3 * MiB), (300.0, 4 * MiB), (400.0, 5 * MiB))
    assert h.total_bytes("0") == 24564 * MiB
    assert h.peak_used_bytes("0") == 5 * MiB
    assert len(h) == 3


def test_history_default_is_five_minutes_and_bounded() -> None:
    h = MemoryHistory()
    assert h.max_age_s == 300.0
    small = MemoryHistory(max_points=3)
    b = clocked(one_gpu(), [float(t) for t in range(10)])
    for _ in range(10):
        small.add(b.snapshot())
    assert [t for t, _ in small.series("0")] == [7.0, 8.0, 9.0]


def test_history_gaps_mig_and_forgetting() -> None:
    b = clocked("gpu_lost", [float(t) for t in range(6)])
    h = MemoryHistory(max_age_s=2)
    for _ in range(6):
        h.add(b.snapshot())
    assert [u for _, u in h.series("1")] == [None, None, None]  # lost: gaps
    assert all(u is not None for _, u in h.series("0"))
    mig = clocked("a100_mig", [0.0, 1.0])
    hm = MemoryHistory()
    hm.add(mig.snapshot())
    assert hm.keys() == ["0", "0:0", "0:1", "0:2"]
    # a device that disappears is forgotten after max_age
    h2 = MemoryHistory(max_age_s=10)
    h2.add(GpuSnapshot(taken_at=0, backend="x", devices=(GpuDevice(index=0, name="g", used_bytes=1),)))
    h2.add(GpuSnapshot(taken_at=5, backend="x"))
    assert h2.keys() == ["0"]
    h2.add(GpuSnapshot(taken_at=11, backend="x"))
    assert h2.keys() == []


def test_history_restarts_when_the_clock_goes_back() -> None:
    h = MemoryHistory()
    dev = (GpuDevice(index=0, name="g", used_bytes=1),)
    h.add(GpuSnapshot(taken_at=100, backend="x", devices=dev))
    h.add(GpuSnapshot(taken_at=50, backend="x", devices=dev))
    assert h.series("0") == ((50, 1),)


def test_history_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        MemoryHistory(max_age_s=0)
    with pytest.raises(ValueError):
        MemoryHistory(max_points=0)


# ---- reports ----------------------------------------------------------------------------------------------


def test_json_keys_are_stable() -> None:
    doc = snapshot_to_json(FakeBackend("a100_mig").snapshot())
    assert list(doc) == [
        "schema",
        "taken_at",
        "backend",
        "available",
        "unavailable_reason",
        "driver_version",
        "cuda_driver_version",
        "nvml_version",
        "cuda_visible_devices",
        "devices",
        "notes",  # added by the cluster view (keys are only ever added, at the end)
    ]
    assert list(doc["devices"][1]) == [
        "key",
        "index",
        "cuda_index",
        "uuid",
        "name",
        "pci_bus_id",
        "is_mig_instance",
        "parent_index",
        "parent_uuid",
        "gpu_instance_id",
        "compute_instance_id",
        "mig_mode",
        "total_bytes",
        "used_bytes",
        "free_bytes",
        "reserved_bytes",
        "utilization_percent",
        "temperature_c",
        "power_draw_w",
        "power_limit_w",
        "processes",
        "error",
        "host",  # added by the cluster view
        "sample_age_s",
        "stale",
        "workloads",
        "cuda_total_bytes",  # added with issue 33: total less reserved, what CUDA reports
    ]
    assert doc["devices"][0]["processes"] is None
    assert list(doc["devices"][1]["processes"][0]) == ["pid", "name", "used_bytes", "kind"]


def test_table() -> None:
    text = format_snapshot(FakeBackend("rtx4090_browser").snapshot())
    lines = text.splitlines()
    assert lines[0].startswith("backend fake:rtx4090_browser, driver 550.54.15, CUDA 12.4")
    assert lines[1].split() == [
        "GPU",
        "CUDA",
        "Name",
        "Used",
        "/",
        "Total",
        "(CUDA)",
        "GiB",
        "Free",
        "GiB",
        "Util",
        "Temp",
        "Procs",
    ]
    row = lines[2].split()
    assert row[:2] == ["0", "0"] and "24.0" in row and "(23.7)" in row and row[-1] == "2"  # 24564 - 318 MiB
    mig = format_snapshot(FakeBackend("a100_mig").snapshot())
    assert "  0:1" in mig and "MIG 2g.20gb" in mig
    assert format_snapshot(GpuSnapshot(taken_at=0, backend="nvml")) == "No NVIDIA GPU found (backend nvml)."
