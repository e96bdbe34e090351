"""NvmlBackend against an injected fake NVML module: init failures, lost GPUs, unsupported fields, MIG, v1."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
from pathlib import Path

import pynvml
import pytest

from gpumem_gui.hardware import GPU_LOST_ERROR, GpuBackend, HardwareError, NvmlBackend, init_failure_reason
from gpumem_gui.hardware import nvml as nvml_module
from gpumem_gui.hardware.backend import CLOSED_REASON, InitFailure
from tests.fake_nvml import FakeGpu, FakeNvml, FakeProc, MiB, a100_with_migs


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def atexit_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(nvml_module.atexit, "register", lambda f: calls.append(("register", f)))
    monkeypatch.setattr(nvml_module.atexit, "unregister", lambda f: calls.append(("unregister", f)))
    return calls


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid="GPU-11111111-aaaa-bbbb-cccc-000000000000",
            compute=[FakeProc(100, 2048 * MiB)],
            graphics=[FakeProc(100, 2048 * MiB), FakeProc(200, 512 * MiB)],
        ),
        FakeGpu(uuid="GPU-22222222-aaaa-bbbb-cccc-000000000000", bus_id=b"00000000:02:00.0", used=0),
    ]


def backend(fake: FakeNvml, **kw: object) -> NvmlBackend:
    return NvmlBackend(nvml_module=fake, proc_root=Path("/nonexistent-proc"), **kw)  # type: ignore[arg-type]


# ---- init -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, InitFailure.LIBRARY_NOT_FOUND),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, InitFailure.DRIVER_NOT_LOADED),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, InitFailure.LIB_RM_VERSION_MISMATCH),
        (pynvml.NVML_ERROR_NO_PERMISSION, InitFailure.NO_PERMISSION),
    ],
)
def test_init_failures_give_an_unavailable_snapshot(code: int, kind: InitFailure, atexit_calls: list) -> None:
    fake = FakeNvml(two_gpus(), init_error=code)
    b = backend(fake)
    snap = b.snapshot()
    assert not snap.available
    assert snap.devices == ()
    assert snap.unavailable_reason == init_failure_reason(kind)
    assert snap.backend == "nvml"
    # initialised once: a second poll does not retry, and nothing is shut down or registered
    b.snapshot()
    b.close()
    assert fake.calls["nvmlInitWithFlags"] == 1
    assert fake.calls["nvmlShutdown"] == 0
    assert atexit_calls == []


def test_library_missing_reason_is_plain_words() -> None:
    snap = backend(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)).snapshot()
    assert snap.unavailable_reason is not None
    assert "No NVIDIA driver found" in snap.unavailable_reason
    assert "libnvidia-ml.so.1" in snap.unavailable_reason or "nvml.dll" in snap.unavailable_reason
    assert "catalog GPU" in snap.unavailable_reason


def test_unknown_init_error_names_the_library_message() -> None:
    snap = backend(FakeNvml(init_error=pynvml.NVML_ERROR_UNKNOWN)).snapshot()
    assert snap.unavailable_reason is not None
    assert "Unknown Error" in snap.unavailable_reason
    assert "catalog GPU" in snap.unavailable_reason


def test_version_mismatch_says_reboot() -> None:
    snap = backend(FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)).snapshot()
    assert snap.unavailable_reason is not None and "Reboot" in snap.unavailable_reason


def test_zero_gpus_is_a_state_not_an_error(atexit_calls: list) -> None:
    fake = FakeNvml([])
    b = backend(fake)
    snap = b.snapshot()
    assert snap.available and snap.devices == ()
    assert fake.init_flags == pynvml.NVML_INIT_FLAG_NO_GPUS
    assert snap.driver_version == "550.54.15"
    assert snap.cuda_driver_version == "12.4"
    assert snap.nvml_version == "12.550.54.15"
    assert atexit_calls == [("register", b.close)]
    b.close()
    b.close()
    assert fake.calls["nvmlShutdown"] == 1
    assert atexit_calls[-1] == ("unregister", b.close)
    closed = b.snapshot()
    assert closed.unavailable_reason == CLOSED_REASON


def test_init_once_under_concurrent_first_snapshots() -> None:
    fake = FakeNvml(two_gpus())
    b = backend(fake)
    threads = [threading.Thread(target=b.snapshot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls["nvmlInitWithFlags"] == 1
    b.close()


def test_is_a_gpu_backend() -> None:
    assert isinstance(backend(FakeNvml()), GpuBackend)


def test_importing_hardware_does_not_import_pynvml() -> None:
    code = "import sys, gpumem_gui.hardware as h; h.NvmlBackend(); assert 'pynvml' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_pynvml_here() -> None:
    """With the real binding: no driver -> the library-missing reason; with a driver -> live devices."""
    b = NvmlBackend()
    try:
        snap = b.snapshot()
    finally:
        b.close()
    if _driver_present():
        assert snap.available, snap.unavailable_reason
        assert all(d.total_bytes for d in snap.devices if d.ok and not d.is_mig_instance)
    else:
        assert snap.unavailable_reason == init_failure_reason(InitFailure.LIBRARY_NOT_FOUND)


# ---- devices --------------------------------------------------------------------------------------------


def test_two_gpus_all_fields() -> None:
    fake = FakeNvml(two_gpus(), process_names={100: "/usr/bin/python3.11"})
    b = backend(fake, clock=lambda: 1234.5)
    snap = b.snapshot()
    assert snap.taken_at == 1234.5
    g0, g1 = snap.devices
    assert g0.name == "NVIDIA GeForce RTX 4090"
    assert g0.uuid == "GPU-11111111-aaaa-bbbb-cccc-000000000000"
    assert g0.pci_bus_id == "00000000:01:00.0"  # decoded from the struct's bytes
    assert g0.total_bytes == 24564 * MiB
    assert g0.reserved_bytes == 318 * MiB
    assert g0.used_bytes == 1024 * MiB
    assert g0.free_bytes == (24564 - 318 - 1024) * MiB
    assert g0.utilization_percent == 7
    assert g0.temperature_c == 41
    assert g0.power_draw_w == pytest.approx(33.9)
    assert g0.power_limit_w == pytest.approx(450.0)
    assert g0.mig_mode is False
    assert g0.error is None
    assert g0.cuda_index == 0 and g1.cuda_index == 1
    procs = {p.pid: p for p in g0.processes or ()}
    assert procs[100].kind == "compute+graphics" and procs[100].used_bytes == 2048 * MiB
    assert procs[100].name == "python3.11"
    assert procs[200].kind == "graphics" and procs[200].name is None  # no NVML name, no /proc entry
    assert g1.processes == ()
    b.close()


def test_process_names_from_proc_and_cached(tmp_path: Path) -> None:
    (tmp_path / "200").mkdir()
    (tmp_path / "200" / "comm").write_text("firefox\n")
    fake = FakeNvml(two_gpus())
    b = NvmlBackend(nvml_module=fake, proc_root=tmp_path)
    names = {p.pid: p.name for p in b.snapshot().devices[0].processes or ()}
    assert names == {100: None, 200: "firefox"}
    asked = fake.calls["nvmlSystemGetProcessName"]
    b.snapshot()
    assert fake.calls["nvmlSystemGetProcessName"] == asked  # names are cached per pid
    b.close()


def test_process_memory_not_available_is_none() -> None:
    gpu = FakeGpu(compute=[FakeProc(7, None)])
    snap = backend(FakeNvml([gpu])).snapshot()
    assert snap.devices[0].processes is not None
    assert snap.devices[0].processes[0].used_bytes is None


def test_one_gpu_lost_mid_poll_keeps_the_others() -> None:
    gpus = two_gpus()
    fake = FakeNvml(gpus)
    b = backend(fake)
    first = b.snapshot()
    assert all(d.ok for d in first.devices)
    gpus[0].lost = True
    second = b.snapshot()
    lost, other = second.devices
    assert lost.error == GPU_LOST_ERROR
    assert lost.name == "NVIDIA GeForce RTX 4090"  # what was read before it was lost
    assert lost.uuid == gpus[0].uuid
    assert lost.total_bytes is None and lost.used_bytes is None and lost.processes is None
    assert other.ok and other.total_bytes == 24564 * MiB
    gpus[0].lost = False
    assert all(d.ok for d in b.snapshot().devices)  # it came back
    b.close()


def test_gpu_failing_before_its_name_was_read() -> None:
    gpus = two_gpus()
    gpus[1].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_UNKNOWN
    snap = backend(FakeNvml(gpus)).snapshot()
    assert snap.devices[0].ok
    bad = snap.devices[1]
    assert bad.name == "unknown GPU" and bad.uuid is None
    assert bad.error == "NVML error: Unknown Error"


def test_not_supported_fields_become_none() -> None:
    gpu = FakeGpu(mig_mode=None)
    for call in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPciInfo",
    ):
        gpu.fail[call] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu.fail["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    d = backend(FakeNvml([gpu])).snapshot().devices[0]
    assert d.ok
    assert d.utilization_percent is None
    assert d.temperature_c is None
    assert d.power_draw_w is None
    assert d.power_limit_w is None  # enforced limit NotSupported and no management limit in this fake
    assert d.pci_bus_id is None
    assert d.mig_mode is None
    assert d.total_bytes == 24564 * MiB


def test_process_list_denied() -> None:
    gpu = FakeGpu(compute=[FakeProc(1, MiB)])
    gpu.fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    d = backend(FakeNvml([gpu])).snapshot().devices[0]
    assert d.ok and d.processes is None


def test_old_driver_without_processes_v3_uses_v2() -> None:
    gpu = FakeGpu(compute=[FakeProc(5, 10 * MiB)])
    fake = FakeNvml([gpu], driver_has_processes_v3=False)
    d = backend(fake).snapshot().devices[0]
    assert d.processes is not None and d.processes[0].pid == 5
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1


def test_old_driver_without_temperature_v_uses_the_old_call() -> None:
    fake = FakeNvml([FakeGpu(temp=55)], driver_has_temperature_v=False)
    b = backend(fake)
    assert b.snapshot().devices[0].temperature_c == 55
    assert b.snapshot().devices[0].temperature_c == 55
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1  # not asked again


def test_memory_info_v1_only_driver() -> None:
    fake = FakeNvml([FakeGpu()], driver_has_memory_v2=False)
    b = backend(fake)
    for _ in range(2):
        d = b.snapshot().devices[0]
        assert d.reserved_bytes is None
        assert d.used_bytes == (1024 + 318) * MiB  # v1 counts the reserved part as used
        assert d.free_bytes == (24564 - 318 - 1024) * MiB
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # tried once, then v1 only


def test_binding_without_memory_v2() -> None:
    fake = FakeNvml([FakeGpu()], binding_has_memory_v2=False)
    d = backend(fake).snapshot().devices[0]
    assert d.reserved_bytes is None and d.total_bytes == 24564 * MiB
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 0


def test_memory_not_supported_leaves_memory_unknown() -> None:
    gpu = FakeGpu()
    gpu.fail["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    d = backend(FakeNvml([gpu])).snapshot().devices[0]
    assert d.ok and d.total_bytes is None and d.free_bytes is None


def test_other_nvml_errors_become_hardware_error() -> None:
    fake = FakeNvml(two_gpus())
    fake.count_error = pynvml.NVML_ERROR_UNKNOWN
    b = backend(fake)
    with pytest.raises(HardwareError) as info:
        b.snapshot()
    assert "Unknown Error" in info.value.reason
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    fake.count_error = None
    assert len(b.snapshot().devices) == 2  # and the next poll works


def test_a_non_nvml_failure_is_still_a_hardware_error() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("boom")

    with pytest.raises(HardwareError, match="RuntimeError: boom"):
        backend(Broken()).snapshot()


# ---- MIG ------------------------------------------------------------------------------------------------


def test_mig_instances() -> None:
    a100 = a100_with_migs()
    snap = backend(FakeNvml([a100])).snapshot()
    parent, *migs = snap.devices
    assert parent.mig_mode is True and not parent.is_mig_instance
    assert parent.processes is None  # the aggregate list needs privileges
    assert parent.utilization_percent is None
    assert [m.key for m in migs] == ["0:0", "0:2", "0:5"]
    m0 = migs[0]
    assert m0.is_mig_instance and m0.parent_index == 0 and m0.parent_uuid == a100.uuid
    assert m0.name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert m0.total_bytes == 40192 * MiB and m0.used_bytes == 35840 * MiB
    assert m0.gpu_instance_id == 2 and m0.compute_instance_id == 0
    assert m0.processes is not None and m0.processes[0].pid == 7001
    assert m0.pci_bus_id == "00000000:07:00.0"
    assert [m.total_bytes for m in migs[1:]] == [19968 * MiB, 19968 * MiB]
    # CUDA sees one MIG device: the first instance
    assert [d.key for d in snap.cuda_devices] == ["0:0"]
    assert parent.cuda_index is None


def test_mig_instance_error_is_its_own() -> None:
    a100 = a100_with_migs()
    a100.migs[2].lost = True
    snap = backend(FakeNvml([a100])).snapshot()
    bad = snap.device("0:2")
    assert bad is not None and bad.error == GPU_LOST_ERROR and bad.is_mig_instance
    assert snap.device("0:0").ok and snap.device("0:5").ok  # type: ignore[union-attr]


# ---- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------------------


def test_cuda_visible_devices_by_index() -> None:
    snap = backend(FakeNvml(two_gpus()), cuda_visible_devices="1,0").snapshot()
    assert snap.visible_devices == "1,0"
    assert [d.cuda_index for d in snap.devices] == [1, 0]


def test_cuda_visible_devices_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    b = backend(FakeNvml(two_gpus()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    snap = b.snapshot()
    assert snap.visible_devices == "1"
    assert [d.cuda_index for d in snap.devices] == [None, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert [d.cuda_index for d in b.snapshot().devices] == [None, None]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    snap = b.snapshot()
    assert snap.visible_devices is None and [d.cuda_index for d in snap.devices] == [0, 1]


def test_cuda_visible_devices_by_uuid_prefix() -> None:
    snap = backend(FakeNvml(two_gpus()), cuda_visible_devices="GPU-2222,GPU-11111111-aaaa").snapshot()
    assert [d.cuda_index for d in snap.devices] == [1, 0]


def test_cuda_visible_devices_by_mig_uuid() -> None:
    a100 = a100_with_migs()
    cvd = a100.migs[5].uuid
    snap = backend(FakeNvml([a100]), cuda_visible_devices=cvd).snapshot()
    assert [d.key for d in snap.cuda_devices] == ["0:5"]
    legacy = backend(FakeNvml([a100_with_migs()]), cuda_visible_devices=f"MIG-{a100.uuid}/3/0").snapshot()
    assert [d.key for d in legacy.cuda_devices] == ["0:2"]
