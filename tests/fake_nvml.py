"""A tiny stand-in for the ``pynvml`` module, injected into ``NvmlBackend(nvml_module=...)`` by tests.

It has the names ``NvmlBackend`` uses, with the real binding's error classes and constants (``pynvml``
imports without the driver; only ``nvmlInit`` needs it), and devices that tests script and break: a call name
in ``FakeGpu.fail`` raises that NVML error code, ``FakeGpu.lost`` makes every call on the GPU raise
``GpuIsLost``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real

MiB = 1 << 20


@dataclass
class FakeProc:
    pid: int
    used: int | None  # bytes; None as the binding reports NVML_VALUE_NOT_AVAILABLE


@dataclass(eq=False)
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 4090"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: bytes = b"00000000:01:00.0"
    total: int = 24564 * MiB
    reserved: int = 318 * MiB
    used: int = 1024 * MiB
    util: int = 7
    temp: int = 41
    power_mw: int = 33_900
    limit_mw: int = 450_000
    compute: list[FakeProc] = field(default_factory=list)
    graphics: list[FakeProc] = field(default_factory=list)
    mig_mode: int | None = 0  # None: NotSupported
    migs: dict[int, FakeGpu] = field(default_factory=dict)  # slot -> MIG device
    max_migs: int = 7
    gi: int | None = None
    ci: int | None = None
    fail: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code
    lost: bool = False

    @property
    def free(self) -> int:
        return self.total - self.reserved - self.used


class FakeNvml:
    """``pynvml`` look-alike. ``calls`` counts every call by name."""

    NVMLError = real.NVMLError
    NVMLLibraryMismatchError = real.NVMLLibraryMismatchError

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        driver_has_memory_v2: bool = True,
        binding_has_memory_v2: bool = True,
        driver_has_processes_v3: bool = True,
        driver_has_temperature_v: bool = True,
        process_names: dict[int, str] | None = None,
    ) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver_has_memory_v2 = driver_has_memory_v2
        self.driver_has_processes_v3 = driver_has_processes_v3
        self.driver_has_temperature_v = driver_has_temperature_v
        self.process_names = dict(process_names or {})
        self.calls: Counter[str] = Counter()
        self.initialized = 0
        self.count_error: int | None = None
        for name in dir(real):
            if name.startswith(("NVML_ERROR_", "NVML_INIT_FLAG_", "NVML_TEMPERATURE_", "NVML_DEVICE_MIG_")):
                setattr(self, name, getattr(real, name))
        if binding_has_memory_v2:
            self.nvmlMemory_v2 = real.nvmlMemory_v2

    # ---- helpers ---------------------------------------------------------------------------------------

    def _call(self, name: str, handle: FakeGpu | None = None) -> None:
        self.calls[name] += 1
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            if handle.lost:
                raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
            if name in handle.fail:
                raise real.NVMLError(handle.fail[name])

    # ---- init ------------------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls["nvmlInitWithFlags"] += 1
        self.init_flags = flags
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialized += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized -= 1

    # ---- system ----------------------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._call("nvmlSystemGetNVMLVersion")
        return "12.550.54.15"

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._call("nvmlSystemGetProcessName")
        if pid not in self.process_names:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return self.process_names[pid]

    # ---- devices ---------------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise real.NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._call("nvmlDeviceGetHandleByIndex")
        if index >= len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if "nvmlDeviceGetHandleByIndex" in gpu.fail:
            raise real.NVMLError(gpu.fail["nvmlDeviceGetHandleByIndex"])
        return gpu

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._call("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._call("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        self._call("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=h.bus_id, busIdLegacy=h.bus_id[4:])  # bytes, as the real struct gives

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> Any:
        if version:
            self._call("nvmlDeviceGetMemoryInfo_v2", h)
            if not self.driver_has_memory_v2:
                raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
            return SimpleNamespace(
                version=version, total=h.total, reserved=h.reserved, free=h.free, used=h.used
            )
        self._call("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(
            total=h.total, free=h.free, used=h.used + h.reserved
        )  # v1: used includes reserved

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self._call("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=h.util, memory=h.util // 2)

    def nvmlDeviceGetTemperatureV(self, h: FakeGpu, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperatureV", h)
        if not self.driver_has_temperature_v:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        return h.temp

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", h)
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._call("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        self._call("nvmlDeviceGetEnforcedPowerLimit", h)
        return h.limit_mw

    def _procs(self, procs: list[FakeProc]) -> list[Any]:
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used, gpuInstanceId=0, computeInstanceId=0)
            for p in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses", h)
        if not self.driver_has_processes_v3:
            # what the real binding's @throwOnVersionMismatch raises when the driver lacks the _v3 symbol
            raise real.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match"
            )
        return self._procs(h.compute)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: FakeGpu) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return self._procs(h.compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self._call("nvmlDeviceGetGraphicsRunningProcesses", h)
        return self._procs(h.graphics)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._call("nvmlDeviceGetMigMode", h)
        if h.mig_mode is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._call("nvmlDeviceGetMaxMigDeviceCount", h)
        return h.max_migs if h.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeGpu:
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index not in h.migs:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return h.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeGpu) -> int:
        self._call("nvmlDeviceGetGpuInstanceId", h)
        if h.gi is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return h.gi

    def nvmlDeviceGetComputeInstanceId(self, h: FakeGpu) -> int:
        self._call("nvmlDeviceGetComputeInstanceId", h)
        if h.ci is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return h.ci


def a100_with_migs() -> FakeGpu:
    """An A100-SXM4-80GB in MIG mode: 3g.40gb in slot 0, 2g.20gb in slots 2 and 5 (gaps are NotFound)."""
    parent_uuid = "GPU-a1000000-0000-0000-0000-000000000001"

    def mig(
        slot: int, profile: str, total_mib: int, used_mib: int, gi: int, procs: list[FakeProc]
    ) -> FakeGpu:
        return FakeGpu(
            name=f"NVIDIA A100-SXM4-80GB MIG {profile}",
            uuid=f"MIG-a1000000-0000-0000-0000-00000000010{slot}",
            total=total_mib * MiB,
            reserved=0,
            used=used_mib * MiB,
            compute=procs,
            mig_mode=None,
            gi=gi,
            ci=0,
            fail={
                "nvmlDeviceGetUtilizationRates": real.NVML_ERROR_NOT_SUPPORTED,
                "nvmlDeviceGetTemperatureV": real.NVML_ERROR_NOT_SUPPORTED,
                "nvmlDeviceGetPowerUsage": real.NVML_ERROR_NOT_SUPPORTED,
            },
        )

    return FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        uuid=parent_uuid,
        bus_id=b"00000000:07:00.0",
        total=81920 * MiB,
        reserved=0,
        used=(35840 + 6144) * MiB,
        mig_mode=1,
        migs={
            0: mig(0, "3g.40gb", 40192, 35840, 2, [FakeProc(7001, 35840 * MiB)]),
            2: mig(2, "2g.20gb", 19968, 6144, 3, [FakeProc(7150, 6144 * MiB)]),
            5: mig(5, "2g.20gb", 19968, 0, 4, []),
        },
        fail={
            "nvmlDeviceGetUtilizationRates": real.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetComputeRunningProcesses": real.NVML_ERROR_NO_PERMISSION,
        },
    )
