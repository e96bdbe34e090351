"""FakeBackend: the shipped scenarios and how a scenario's steps, faults and processes behave."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.hardware import (
    GPU_LOST_ERROR,
    FakeBackend,
    GpuBackend,
    HardwareError,
    InitFailure,
    format_snapshot,
    init_failure_reason,
    scenarios_dir,
    shipped_scenarios,
    snapshot_to_json,
)
from tests.fake_scenarios import SHIPPED, MiB, one_gpu


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# ---- shipped scenarios ------------------------------------------------------------------------------------


def test_all_expected_scenarios_are_shipped() -> None:
    assert set(SHIPPED) <= set(shipped_scenarios())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenario_runs(name: str) -> None:
    b = FakeBackend(scenarios_dir() / f"{name}.json")
    assert isinstance(b, GpuBackend)
    assert b.name == f"fake:{name}"
    for _ in range(12):
        snap = b.snapshot()
        assert snap.backend == f"fake:{name}"
        doc = snapshot_to_json(snap)
        json.dumps(doc)  # JSON-ready
        assert doc["schema"] == "gpumem.gpus/1"
        assert format_snapshot(snap)
        for d in snap.devices:
            if d.ok and d.total_bytes is not None:
                assert d.used_bytes is not None and d.free_bytes is not None
                assert d.free_bytes <= d.total_bytes
    b.close()


def test_rtx4090_browser() -> None:
    snap = FakeBackend("rtx4090_browser").snapshot()
    (d,) = snap.devices
    assert d.name == "NVIDIA GeForce RTX 4090"
    assert d.total_bytes == 24564 * MiB
    browser = [p for p in d.processes or () if p.name == "firefox"]
    assert browser and browser[0].used_bytes == 1024 * MiB and browser[0].kind == "graphics"
    assert d.used_bytes == d.process_used_bytes
    assert d.free_bytes == d.total_bytes - (d.reserved_bytes or 0) - (d.used_bytes or 0)


def test_8xh100_busy_varies_over_time() -> None:
    b = FakeBackend("8xh100_busy")
    snaps = [b.snapshot() for _ in range(10)]
    assert all(len(s.devices) == 8 for s in snaps)
    assert {d.name for d in snaps[0].devices} == {"NVIDIA H100 80GB HBM3"}
    assert all(d.total_bytes == 81559 * MiB for d in snaps[0].devices)
    used0 = [s.devices[0].used_bytes for s in snaps]
    assert len(set(used0)) > 3  # the training job ramps up
    assert snaps[0].devices[0].processes == ()  # not started yet at step 0
    assert [d.cuda_index for d in snaps[0].devices] == list(range(8))


def test_a100_mig() -> None:
    snap = FakeBackend("a100_mig").snapshot()
    parent = snap.device("0")
    assert parent is not None and parent.mig_mode is True and parent.processes is None
    migs = snap.mig_instances(0)
    assert [m.name.rsplit(" ", 1)[-1] for m in migs] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    assert [m.total_bytes for m in migs] == [40192 * MiB, 19968 * MiB, 19968 * MiB]
    assert all(m.uuid and m.uuid.startswith("MIG-") for m in migs)
    assert parent.used_bytes == sum(m.used_bytes or 0 for m in migs)
    assert [d.key for d in snap.cuda_devices] == ["0:0"]


def test_gpu_lost_after_three_polls() -> None:
    b = FakeBackend("gpu_lost")
    snaps = [b.snapshot() for _ in range(6)]
    for s in snaps[:3]:
        assert all(d.ok for d in s.devices)
    for s in snaps[3:]:
        ok, lost = s.devices
        assert ok.ok and ok.total_bytes is not None
        assert lost.error == GPU_LOST_ERROR and lost.total_bytes is None and lost.processes is None
        assert lost.name == "NVIDIA RTX A6000"
    assert "ERROR: GPU is lost" in format_snapshot(snaps[-1])


def test_no_driver() -> None:
    snap = FakeBackend("no_driver").snapshot()
    assert snap.devices == ()
    assert snap.unavailable_reason == init_failure_reason(InitFailure.LIBRARY_NOT_FOUND)
    assert format_snapshot(snap).startswith("No live GPU data")
    assert snapshot_to_json(snap)["available"] is False


# ---- scenario behaviour -----------------------------------------------------------------------------------


def test_steps_cycle_or_hold() -> None:
    cyc = FakeBackend(one_gpu(used_mib=[1, 2, 3]))
    assert [cyc.snapshot().devices[0].used_bytes for _ in range(5)] == [m * MiB for m in (1, 2, 3, 1, 2)]
    hold = FakeBackend({"at_end": "hold", **one_gpu(used_mib=[1, 2, 3])})
    assert [hold.snapshot().devices[0].used_bytes for _ in range(5)] == [m * MiB for m in (1, 2, 3, 3, 3)]
    assert hold.step == 5
    hold.reset()
    assert hold.snapshot().devices[0].used_bytes == 1 * MiB


def test_processes_come_and_go() -> None:
    b = FakeBackend(one_gpu(processes=[{"pid": 9, "name": "python", "used_mib": [None, 100, None]}]))
    counts = [len(b.snapshot().devices[0].processes or ()) for _ in range(3)]
    assert counts == [0, 1, 0]


def test_not_supported_and_denied() -> None:
    b = FakeBackend(
        one_gpu(
            not_supported=["utilization_percent", "temperature_c", "power_draw_w", "power_limit_w", "memory"],
            processes_denied=True,
        )
    )
    d = b.snapshot().devices[0]
    assert d.ok
    assert (d.utilization_percent, d.temperature_c, d.power_draw_w, d.power_limit_w) == (None,) * 4
    assert d.total_bytes is None and d.free_bytes is None
    assert d.processes is None
    assert "denied" in format_snapshot(b.snapshot())


def test_memory_info_v1_only() -> None:
    b = FakeBackend({"faults": {"memory_info_v1_only": True}, **one_gpu(reserved_mib=300, used_mib=1000)})
    d = b.snapshot().devices[0]
    assert d.reserved_bytes is None and d.used_bytes == 1300 * MiB
    assert d.free_bytes == (24564 - 1300) * MiB


def test_injected_snapshot_errors() -> None:
    b = FakeBackend({"faults": {"raise_at_steps": [1]}, **one_gpu()})
    b.snapshot()
    with pytest.raises(HardwareError, match="injected fault at step 1"):
        b.snapshot()
    assert b.snapshot().devices


@pytest.mark.parametrize("kind", [k.value for k in InitFailure])
def test_init_faults(kind: str) -> None:
    snap = FakeBackend({"faults": {"nvml_init_error": kind}}).snapshot()
    assert snap.unavailable_reason == init_failure_reason(kind, "fake scenario")


def test_cuda_visible_devices_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    snap = FakeBackend("8xh100_busy").snapshot()
    assert snap.visible_devices == "3,1"
    assert [d.index for d in snap.cuda_devices] == [3, 1]
    explicit = FakeBackend("8xh100_busy", cuda_visible_devices=None).snapshot()
    assert explicit.visible_devices is None and len(explicit.cuda_devices) == 8


def test_uuids_are_stable_and_explicit_ones_kept() -> None:
    a = FakeBackend("8xh100_busy").snapshot()
    b = FakeBackend("8xh100_busy").snapshot()
    assert [d.uuid for d in a.devices] == [d.uuid for d in b.devices]
    assert len({d.uuid for d in a.devices}) == 8
    c = FakeBackend(one_gpu(uuid="GPU-1234")).snapshot()
    assert c.devices[0].uuid == "GPU-1234"


def test_closed_backend() -> None:
    b = FakeBackend(one_gpu())
    b.close()
    assert b.snapshot().unavailable_reason is not None
