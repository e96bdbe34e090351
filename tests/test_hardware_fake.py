"""FakeBackend scenarios (shipped and broken), the null backend, history and the JSON/text reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.hardware import (
    GPU_LOST_ERROR,
    FakeBackend,
    GpuBackend,
    GpuDevice,
    GpuSnapshot,
    HardwareError,
    InitFailure,
    MemoryHistory,
    NullBackend,
    NvmlBackend,
    default_backend,
    format_snapshot,
    init_failure_reason,
    scenarios_dir,
    shipped_scenarios,
    snapshot_to_json,
)

MiB = 1 << 20
SHIPPED = ["8xh100_busy", "a100_mig", "gpu_lost", "no_driver", "rtx4090_browser"]


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def one_gpu(**gpu: object) -> dict:
    return {"gpus": [{"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, **gpu}]}


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


# ---- broken scenarios -----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "broken.json"
    p.write_text(text)
    return p


def test_bad_json_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, '{"gpus": [}')
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(p)
    msg = str(info.value)
    assert str(p) in msg and "not valid JSON" in msg and "line 1" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        (one_gpu(total_mib=-1), "gpus.0.total_mib", "greater than 0"),
        ({"gpus": [{"total_mib": 10}]}, "gpus.0.name", "required"),
        (one_gpu(colour="red"), "gpus.0.colour", "Extra inputs"),
        (one_gpu(utilization_percent=[10, 101]), "gpus.0.utilization_percent", ""),
        (one_gpu(not_supported=["fan"]), "gpus.0.not_supported.0", ""),
        ({"faults": {"nvml_init_error": "gremlins"}}, "faults.nvml_init_error", ""),
        ({"at_end": "bounce"}, "at_end", ""),
        ({"version": 2}, "version", ""),
    ],
)
def test_bad_field_names_file_and_field(tmp_path: Path, doc: dict, field: str, words: str) -> None:
    p = write(tmp_path, json.dumps(doc))
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}: field '{field}")
    assert words in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("gpu", "words"),
    [
        ({"used_mib": [10, 30000]}, "step 1: used_mib 30000"),
        ({"reserved_mib": 30000}, "reserved_mib (30000) is more than total_mib"),
        (
            {"mig_instances": [{"profile": "7g.80gb", "total_mib": 80000, "gpu_instance_id": 0}]},
            "MIG instances",
        ),
        (
            {
                "mig_mode": False,
                "mig_instances": [{"profile": "1g.10gb", "total_mib": 9728, "gpu_instance_id": 9}],
            },
            "mig_mode is false",
        ),
    ],
)
def test_inconsistent_gpu_is_rejected(tmp_path: Path, gpu: dict, words: str) -> None:
    p = write(tmp_path, json.dumps(one_gpu(**gpu)))
    with pytest.raises(GpumemInputError, match=r"field 'gpus\.0'") as info:
        FakeBackend(p)
    assert words in str(info.value)


def test_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="must be a JSON object"):
        FakeBackend(write(tmp_path, "[1, 2]"))


def test_missing_file_lists_the_shipped_ones(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError) as info:
        FakeBackend(tmp_path / "nope.json")
    assert "rtx4090_browser" in str(info.value)
    with pytest.raises(GpumemInputError):
        FakeBackend("no_such_scenario")


def test_bad_inline_scenario() -> None:
    with pytest.raises(GpumemInputError, match=r"fake GPU scenario: field 'gpus\.0\.total_mib'"):
        FakeBackend(one_gpu(total_mib="lots"))


# ---- default backend, null backend, immutability -----------------------------------------------------------


def test_default_backend() -> None:
    assert isinstance(default_backend(), NvmlBackend)
    fake = default_backend(scenarios_dir() / "a100_mig.json")
    assert isinstance(fake, FakeBackend) and fake.name == "fake:a100_mig"
    assert isinstance(default_backend("gpu_lost"), FakeBackend)


def test_null_backend() -> None:
    b = NullBackend("no GPU here")
    assert isinstance(b, GpuBackend)
    snap = b.snapshot()
    assert snap.unavailable_reason == "no GPU here" and snap.devices == () and snap.backend == "null"
    b.close()


def test_snapshots_are_immutable() -> None:
    snap = FakeBackend("rtx4090_browser").snapshot()
    with pytest.raises(ValidationError):
        snap.devices[0].used_bytes = 0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        snap.backend = "x"  # type: ignore[misc]
    assert isinstance(snap.devices, tuple)


def test_snapshot_validation() -> None:
    with pytest.raises(ValidationError):
        GpuSnapshot(taken_at=0, backend="x", unavailable_reason="r", devices=(GpuDevice(index=0, name="g"),))
    with pytest.raises(ValidationError):
        GpuDevice(index=0, name="g", is_mig_instance=True)
    with pytest.raises(ValidationError):
        GpuSnapshot(
            taken_at=0, backend="x", devices=(GpuDevice(index=0, name="g"), GpuDevice(index=0, name="h"))
        )


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
        "GiB",
        "Free",
        "GiB",
        "Util",
        "Temp",
        "Procs",
    ]
    row = lines[2].split()
    assert row[:2] == ["0", "0"] and "24.0" in row and row[-1] == "2"
    mig = format_snapshot(FakeBackend("a100_mig").snapshot())
    assert "  0:1" in mig and "MIG 2g.20gb" in mig
    assert format_snapshot(GpuSnapshot(taken_at=0, backend="nvml")) == "No NVIDIA GPU found (backend nvml)."
