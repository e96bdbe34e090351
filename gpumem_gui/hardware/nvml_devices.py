"""Reading the GPUs and their MIG instances, for the NVML backend (:mod:`gpumem_gui.hardware.nvml`).

An NVML error on one GPU (or MIG instance) becomes that device's ``error`` (``GpuIsLost`` words it as
:data:`~gpumem_gui.hardware.backend.GPU_LOST_ERROR`); the others keep reporting. Any other exception
propagates to :meth:`NvmlBackend.snapshot`. Memory info v2 (with ``reserved``) is used where the driver has
it, v1 otherwise; ``nvmlDeviceGetTemperatureV`` likewise falls back to the deprecated call on older drivers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumem_gui.hardware.backend import GPU_LOST_ERROR
from gpumem_gui.hardware.nvml_calls import NvmlCalls, describe, text
from gpumem_gui.hardware.nvml_processes import ProcessReader
from gpumem_gui.hardware.snapshot import GpuDevice

Memory = tuple[int | None, int | None, int | None, int | None]


@dataclass(frozen=True)
class _Static:
    """What does not change while NVML is up; kept so a lost GPU still shows its name."""

    name: str
    uuid: str | None
    pci_bus_id: str | None


def _parent_of(parent: GpuDevice) -> dict[str, Any]:
    return {"parent_index": parent.index, "parent_uuid": parent.uuid}


class DeviceReader:
    """Reads every GPU through ``calls``; caches what does not change and which call versions work."""

    def __init__(self, calls: NvmlCalls, proc_root: Path) -> None:
        self._calls = calls
        self._processes = ProcessReader(calls, proc_root)
        self._static: dict[int, _Static] = {}
        self._mig_static: dict[tuple[int, int], _Static] = {}
        self._memory_v2: bool | None = None  # None: not tried yet
        self._temperature_v: bool | None = None

    def read_devices(self) -> list[GpuDevice]:
        """Every physical GPU, each followed by its MIG instances."""
        count = int(self._calls.nv.nvmlDeviceGetCount())
        devices: list[GpuDevice] = []
        seen_pids: set[int] = set()
        for i in range(count):
            devices.extend(self._read_physical(i, seen_pids))
        self._processes.forget_all_but(seen_pids)
        return devices

    def _error_device(self, index: int, e: BaseException, **mig: Any) -> GpuDevice:
        key = (mig["parent_index"], index) if mig else None
        static = self._mig_static.get(key) if key else self._static.get(index)
        lost = self._calls.is_code(e, "GPU_IS_LOST")
        message = GPU_LOST_ERROR if lost else f"NVML error: {describe(e)}"
        return GpuDevice(
            index=index,
            uuid=static.uuid if static else None,
            name=static.name if static else "unknown GPU",
            pci_bus_id=static.pci_bus_id if static else None,
            processes=None,
            error=message,
            **mig,
        )

    def _read_static(self, handle: Any) -> _Static:
        optional = self._calls.optional
        name = optional("nvmlDeviceGetName", handle)
        uuid = optional("nvmlDeviceGetUUID", handle)
        pci = optional("nvmlDeviceGetPciInfo", handle)
        bus_id = None
        if pci is not None:
            raw = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
            bus_id = text(raw) if raw else None
        return _Static(
            name=text(name) if name is not None else "unknown GPU",
            uuid=text(uuid) if uuid is not None else None,
            pci_bus_id=bus_id,
        )

    def _read_physical(self, index: int, seen_pids: set[int]) -> list[GpuDevice]:
        optional = self._calls.optional
        try:
            handle = self._calls.nv.nvmlDeviceGetHandleByIndex(index)
            static = self._static.get(index)
            if static is None:
                static = self._static[index] = self._read_static(handle)
            total, used, free, reserved = self._memory(handle)
            util = optional("nvmlDeviceGetUtilizationRates", handle)
            power = optional("nvmlDeviceGetPowerUsage", handle)
            limit = optional("nvmlDeviceGetEnforcedPowerLimit", handle)
            if limit is None:
                limit = optional("nvmlDeviceGetPowerManagementLimit", handle)
            mig_mode = self._mig_mode(handle)
            device = GpuDevice(
                index=index,
                uuid=static.uuid,
                name=static.name,
                pci_bus_id=static.pci_bus_id,
                total_bytes=total,
                used_bytes=used,
                free_bytes=free,
                reserved_bytes=reserved,
                utilization_percent=min(100, int(util.gpu)) if util is not None else None,
                temperature_c=self._temperature(handle),
                power_draw_w=power / 1000.0 if power is not None else None,
                power_limit_w=limit / 1000.0 if limit is not None else None,
                processes=self._processes.processes(handle, seen_pids),
                mig_mode=mig_mode,
            )
        except Exception as e:
            if not self._calls.is_nvml_error(e):
                raise
            return [self._error_device(index, e)]
        out = [device]
        if mig_mode:
            out.extend(self._read_mig_devices(handle, device, seen_pids))
        return out

    def _read_mig_devices(self, handle: Any, parent: GpuDevice, seen_pids: set[int]) -> list[GpuDevice]:
        count = self._calls.optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        out: list[GpuDevice] = []
        for j in range(int(count)):
            try:
                mig_handle = self._calls.nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except Exception as e:
                # an empty slot: NotFound (or InvalidArgument on some drivers)
                if self._calls.is_code(e, "NOT_FOUND", "INVALID_ARGUMENT"):
                    continue
                if not self._calls.is_nvml_error(e):
                    raise
                out.append(self._error_device(j, e, is_mig_instance=True, **_parent_of(parent)))
                continue
            try:
                out.append(self._read_mig(mig_handle, j, parent, seen_pids))
            except Exception as e:
                if not self._calls.is_nvml_error(e):
                    raise
                out.append(self._error_device(j, e, is_mig_instance=True, **_parent_of(parent)))
        return out

    def _read_mig(self, mig_handle: Any, j: int, parent: GpuDevice, seen_pids: set[int]) -> GpuDevice:
        static = self._mig_static.get((parent.index, j))
        if static is None:
            static = self._mig_static[(parent.index, j)] = self._read_static(mig_handle)
        total, used, free, reserved = self._memory(mig_handle)
        gi = self._calls.optional("nvmlDeviceGetGpuInstanceId", mig_handle)
        ci = self._calls.optional("nvmlDeviceGetComputeInstanceId", mig_handle)
        return GpuDevice(
            index=j,
            uuid=static.uuid,
            name=static.name,
            pci_bus_id=parent.pci_bus_id,
            total_bytes=total,
            used_bytes=used,
            free_bytes=free,
            reserved_bytes=reserved,
            processes=self._processes.processes(mig_handle, seen_pids),
            is_mig_instance=True,
            gpu_instance_id=int(gi) if gi is not None else None,
            compute_instance_id=int(ci) if ci is not None else None,
            **_parent_of(parent),
        )

    # ---- fields ------------------------------------------------------------------------------------------

    def _memory(self, handle: Any) -> Memory:
        """(total, used, free, reserved) in bytes: memory info v2 where the driver has it, else v1."""
        nv = self._calls.nv
        v2 = getattr(nv, "nvmlMemory_v2", None)
        if v2 is not None and self._memory_v2 is not False:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(handle, v2)
            except TypeError:  # an old binding whose call takes no version
                self._memory_v2 = False
            except Exception as e:
                if self._calls.is_code(e, "FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH"):
                    self._memory_v2 = False  # the driver has no v2: stop asking
                elif not self._calls.is_code(e, "NOT_SUPPORTED"):
                    raise
            else:
                self._memory_v2 = True
                return int(m.total), int(m.used), int(m.free), int(m.reserved)
        m = self._calls.optional("nvmlDeviceGetMemoryInfo", handle, permission_ok=False)
        if m is None:
            return None, None, None, None
        return int(m.total), int(m.used), int(m.free), None

    def _temperature(self, handle: Any) -> int | None:
        nv = self._calls.nv
        sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        if self._temperature_v is not False and hasattr(nv, "nvmlDeviceGetTemperatureV"):
            try:
                value = nv.nvmlDeviceGetTemperatureV(handle, sensor)
            except Exception as e:
                if self._calls.is_code(e, "FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH"):
                    self._temperature_v = False  # older driver: use the deprecated call below
                elif self._calls.is_unsupported(e) or self._calls.is_code(e, "NO_PERMISSION"):
                    return None
                else:
                    raise
            else:
                self._temperature_v = True
                return int(value)
        value = self._calls.optional("nvmlDeviceGetTemperature", handle, sensor)
        return int(value) if value is not None else None

    def _mig_mode(self, handle: Any) -> bool | None:
        mode = self._calls.optional("nvmlDeviceGetMigMode", handle)
        if mode is None:
            return None
        current = mode[0] if isinstance(mode, list | tuple) else mode
        return int(current) == int(getattr(self._calls.nv, "NVML_DEVICE_MIG_ENABLE", 1))
