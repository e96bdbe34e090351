"""The NVML backend: live GPU memory from NVIDIA's driver. The ONLY module in gpumem that uses ``pynvml``.

``pynvml`` (from the ``nvidia-ml-py`` package) is taken by injection: ``NvmlBackend(nvml_module=fake)`` in
tests, and imported lazily, on the first snapshot, only when nothing was injected. NVML is initialised once,
under a lock, with ``NVML_INIT_FLAG_NO_GPUS`` (a machine with zero GPUs is a state, not an error), and shut
down once by :meth:`NvmlBackend.close` (also registered with :mod:`atexit`).

How NVML's answers are mapped (the patterns of nvitop and gpustat):

* ``nvmlInit`` failing (library missing, driver not loaded, driver upgraded without reboot, no permission,
  anything else) gives snapshots with ``unavailable_reason`` set, never an exception;
* a field the GPU or driver does not support (``NotSupported``, ``FunctionNotFound``, a binding newer than the
  driver) is ``None``; ``NoPermission`` on the process list makes ``processes`` ``None``;
* memory info v2 (with ``reserved``) is used where the driver has it, v1 otherwise (``reserved_bytes=None``,
  and ``used`` then includes what the driver reserves);
* an error on one GPU (``GpuIsLost`` or any other) becomes that GPU's ``error``; the others keep reporting;
* any other NVML error leaves :meth:`NvmlBackend.snapshot` as :class:`HardwareError` (``raise … from e``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumem_gui.hardware.backend import (
    CLOSED_REASON,
    FROM_ENV,
    GPU_LOST_ERROR,
    HardwareError,
    InitFailure,
    VisibleDevices,
    init_failure_reason,
    resolve_visible_devices,
    with_cuda_indices,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuProcess, GpuSnapshot, ProcessKind

# NVML return codes (nvml.h; stable ABI). Read from the module when it has them.
_DEFAULT_CODES = {
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "LIB_RM_VERSION_MISMATCH": 18,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "INVALID_ARGUMENT": 2,
}

_INIT_FAILURES = {
    "LIBRARY_NOT_FOUND": InitFailure.LIBRARY_NOT_FOUND,
    "DRIVER_NOT_LOADED": InitFailure.DRIVER_NOT_LOADED,
    "LIB_RM_VERSION_MISMATCH": InitFailure.LIB_RM_VERSION_MISMATCH,
    "NO_PERMISSION": InitFailure.NO_PERMISSION,
}


@dataclass(frozen=True)
class _Static:
    """What does not change while NVML is up; kept so a lost GPU still shows its name."""

    name: str
    uuid: str | None
    pci_bus_id: str | None


def _text(value: Any) -> str:
    """NVML strings arrive as ``str`` (most calls) or ``bytes`` (struct fields such as ``busId``)."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _cuda_version_text(v: int) -> str:
    """NVML's CUDA driver version ``12040`` is ``"12.4"``."""
    return f"{v // 1000}.{(v % 1000) // 10}"


class NvmlBackend:
    """Live GPUs through NVML.

    Args:
        nvml_module: the ``pynvml`` module, or a stand-in with the same names; imported lazily when None.
        cuda_visible_devices: the ``CUDA_VISIBLE_DEVICES`` value to number devices by; by default the
            environment's, read at each snapshot.
        proc_root: where ``/proc`` is, for process names NVML cannot give.
        clock: the time source for ``taken_at``.
    """

    name = "nvml"

    def __init__(
        self,
        nvml_module: Any = None,
        *,
        cuda_visible_devices: VisibleDevices = FROM_ENV,
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nv: Any = nvml_module
        self._cvd = cuda_visible_devices
        self._proc_root = proc_root
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "new"  # new | ready | failed | closed
        self._failure_reason: str | None = None
        self._codes: dict[str, int] = dict(_DEFAULT_CODES)
        self._driver_version: str | None = None
        self._cuda_driver_version: str | None = None
        self._nvml_version: str | None = None
        self._static: dict[int, _Static] = {}
        self._mig_static: dict[tuple[int, int], _Static] = {}
        self._process_names: dict[int, str | None] = {}
        self._memory_v2: bool | None = None  # None: not tried yet
        self._temperature_v: bool | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def failure_reason(self) -> str | None:
        """Why NVML could not start (after the first snapshot), else None."""
        return self._failure_reason

    def close(self) -> None:
        """Shut NVML down (once); later snapshots say the backend is closed."""
        with self._lock:
            if self._state == "ready":
                atexit.unregister(self.close)
                with contextlib.suppress(Exception):
                    self._nv.nvmlShutdown()
            self._state = "closed"

    def _ensure_init(self) -> bool:
        """Start NVML once (the caller holds the lock); False when it cannot be used."""
        if self._state == "ready":
            return True
        if self._state != "new":
            return False
        if self._nv is None:
            try:
                self._nv = importlib.import_module("pynvml")
            except ImportError:
                return self._fail(init_failure_reason(InitFailure.BINDING_MISSING))
        nv = self._nv
        for key in self._codes:
            self._codes[key] = int(getattr(nv, f"NVML_ERROR_{key}", self._codes[key]))
        try:
            init_with_flags = getattr(nv, "nvmlInitWithFlags", None)
            no_gpus = getattr(nv, "NVML_INIT_FLAG_NO_GPUS", None)
            if init_with_flags is not None and no_gpus is not None:
                init_with_flags(no_gpus)
            else:
                nv.nvmlInit()
        except Exception as e:
            return self._fail(self._init_reason(e))
        self._state = "ready"
        atexit.register(self.close)
        self._driver_version = self._fact("nvmlSystemGetDriverVersion", _text)
        cuda = self._fact("nvmlSystemGetCudaDriverVersion_v2", int)
        if cuda is None:
            cuda = self._fact("nvmlSystemGetCudaDriverVersion", int)
        self._cuda_driver_version = _cuda_version_text(cuda) if cuda else None
        self._nvml_version = self._fact("nvmlSystemGetNVMLVersion", _text)
        return True

    def _fail(self, reason: str) -> bool:
        self._state = "failed"
        self._failure_reason = reason
        return False

    def _init_reason(self, e: Exception) -> str:
        code = self._code(e)
        for key, kind in _INIT_FAILURES.items():
            if code == self._codes[key]:
                return init_failure_reason(kind)
        return init_failure_reason(InitFailure.UNKNOWN, self._describe(e))

    def _fact(self, fn_name: str, convert: Callable[[Any], Any]) -> Any:
        """A driver-wide fact read once at init; any failure makes it unknown."""
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            return None
        try:
            return convert(fn())
        except Exception:
            return None

    # ---- error classification ----------------------------------------------------------------------------

    def _is_nvml_error(self, e: BaseException) -> bool:
        base = getattr(self._nv, "NVMLError", None)
        mismatch = getattr(self._nv, "NVMLLibraryMismatchError", None)
        return any(isinstance(cls, type) and isinstance(e, cls) for cls in (base, mismatch))

    def _code(self, e: BaseException) -> int | None:
        if not self._is_nvml_error(e):
            return None
        value = getattr(e, "value", None)
        return value if isinstance(value, int) else None

    def _is_unsupported(self, e: BaseException) -> bool:
        """NotSupported / FunctionNotFound / a binding newer than the driver: the field is unknown."""
        mismatch = getattr(self._nv, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and isinstance(e, mismatch):
            return True
        return self._code(e) in (self._codes["NOT_SUPPORTED"], self._codes["FUNCTION_NOT_FOUND"])

    def _describe(self, e: BaseException) -> str:
        try:
            text = str(e)
        except Exception:
            text = ""
        return text or type(e).__name__

    def _optional(self, fn_name: str, *args: Any, permission_ok: bool = True) -> Any:
        """Call an NVML getter; None when the binding, the driver or the GPU does not have it."""
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as e:
            if self._is_unsupported(e):
                return None
            if permission_ok and self._code(e) == self._codes["NO_PERMISSION"]:
                return None
            raise

    # ---- snapshot ----------------------------------------------------------------------------------------

    def snapshot(self) -> GpuSnapshot:
        """Poll every GPU (and MIG instance) once."""
        with self._lock:
            taken_at = self._clock()
            if not self._ensure_init():
                reason = CLOSED_REASON if self._state == "closed" else self._failure_reason
                return GpuSnapshot(taken_at=taken_at, backend=self.name, unavailable_reason=reason)
            visible = resolve_visible_devices(self._cvd)
            try:
                devices = self._read_devices()
            except HardwareError:
                raise
            except Exception as e:
                if self._is_nvml_error(e):
                    raise HardwareError(f"Could not read the GPUs: NVML says '{self._describe(e)}'.") from e
                raise HardwareError(f"Could not read the GPUs: {type(e).__name__}: {e}") from e
            return GpuSnapshot(
                taken_at=taken_at,
                driver_version=self._driver_version,
                cuda_driver_version=self._cuda_driver_version,
                nvml_version=self._nvml_version,
                devices=with_cuda_indices(devices, visible),
                visible_devices=visible,
                backend=self.name,
            )

    def _read_devices(self) -> list[GpuDevice]:
        nv = self._nv
        count = int(nv.nvmlDeviceGetCount())
        devices: list[GpuDevice] = []
        seen_pids: set[int] = set()
        for i in range(count):
            devices.extend(self._read_physical(i, seen_pids))
        self._process_names = {pid: n for pid, n in self._process_names.items() if pid in seen_pids}
        return devices

    def _error_device(self, index: int, e: BaseException, **mig: Any) -> GpuDevice:
        key = (mig["parent_index"], index) if mig else None
        static = self._mig_static.get(key) if key else self._static.get(index)
        if self._code(e) == self._codes["GPU_IS_LOST"]:
            message = GPU_LOST_ERROR
        else:
            message = f"NVML error: {self._describe(e)}"
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
        name = self._optional("nvmlDeviceGetName", handle)
        uuid = self._optional("nvmlDeviceGetUUID", handle)
        pci = self._optional("nvmlDeviceGetPciInfo", handle)
        bus_id = None
        if pci is not None:
            raw = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
            bus_id = _text(raw) if raw else None
        return _Static(
            name=_text(name) if name is not None else "unknown GPU",
            uuid=_text(uuid) if uuid is not None else None,
            pci_bus_id=bus_id,
        )

    def _read_physical(self, index: int, seen_pids: set[int]) -> list[GpuDevice]:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            static = self._static.get(index)
            if static is None:
                static = self._static[index] = self._read_static(handle)
            total, used, free, reserved = self._memory(handle)
            util = self._optional("nvmlDeviceGetUtilizationRates", handle)
            power = self._optional("nvmlDeviceGetPowerUsage", handle)
            limit = self._optional("nvmlDeviceGetEnforcedPowerLimit", handle)
            if limit is None:
                limit = self._optional("nvmlDeviceGetPowerManagementLimit", handle)
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
                processes=self._processes(handle, seen_pids),
                mig_mode=mig_mode,
            )
        except Exception as e:
            if not self._is_nvml_error(e):
                raise
            return [self._error_device(index, e)]
        out = [device]
        if mig_mode:
            out.extend(self._read_mig_devices(handle, device, seen_pids))
        return out

    def _read_mig_devices(self, handle: Any, parent: GpuDevice, seen_pids: set[int]) -> list[GpuDevice]:
        count = self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        out: list[GpuDevice] = []
        for j in range(int(count)):
            try:
                mig_handle = self._nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except Exception as e:
                # an empty slot: NotFound (or InvalidArgument on some drivers)
                if self._code(e) in (self._codes["NOT_FOUND"], self._codes["INVALID_ARGUMENT"]):
                    continue
                if not self._is_nvml_error(e):
                    raise
                out.append(self._error_device(j, e, is_mig_instance=True, **self._parent_of(parent)))
                continue
            try:
                static = self._mig_static.get((parent.index, j))
                if static is None:
                    static = self._mig_static[(parent.index, j)] = self._read_static(mig_handle)
                total, used, free, reserved = self._memory(mig_handle)
                gi = self._optional("nvmlDeviceGetGpuInstanceId", mig_handle)
                ci = self._optional("nvmlDeviceGetComputeInstanceId", mig_handle)
                out.append(
                    GpuDevice(
                        index=j,
                        uuid=static.uuid,
                        name=static.name,
                        pci_bus_id=parent.pci_bus_id,
                        total_bytes=total,
                        used_bytes=used,
                        free_bytes=free,
                        reserved_bytes=reserved,
                        processes=self._processes(mig_handle, seen_pids),
                        is_mig_instance=True,
                        gpu_instance_id=int(gi) if gi is not None else None,
                        compute_instance_id=int(ci) if ci is not None else None,
                        **self._parent_of(parent),
                    )
                )
            except Exception as e:
                if not self._is_nvml_error(e):
                    raise
                out.append(self._error_device(j, e, is_mig_instance=True, **self._parent_of(parent)))
        return out

    @staticmethod
    def _parent_of(parent: GpuDevice) -> dict[str, Any]:
        return {"parent_index": parent.index, "parent_uuid": parent.uuid}

    # ---- fields ------------------------------------------------------------------------------------------

    def _memory(self, handle: Any) -> tuple[int | None, int | None, int | None, int | None]:
        """(total, used, free, reserved) in bytes: memory info v2 where the driver has it, else v1."""
        nv = self._nv
        v2 = getattr(nv, "nvmlMemory_v2", None)
        if v2 is not None and self._memory_v2 is not False:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(handle, v2)
            except TypeError:  # an old binding whose call takes no version
                self._memory_v2 = False
            except Exception as e:
                code = self._code(e)
                if code in (self._codes["FUNCTION_NOT_FOUND"], self._codes["ARGUMENT_VERSION_MISMATCH"]):
                    self._memory_v2 = False  # the driver has no v2: stop asking
                elif code != self._codes["NOT_SUPPORTED"]:
                    raise
            else:
                self._memory_v2 = True
                return int(m.total), int(m.used), int(m.free), int(m.reserved)
        m = self._optional("nvmlDeviceGetMemoryInfo", handle, permission_ok=False)
        if m is None:
            return None, None, None, None
        return int(m.total), int(m.used), int(m.free), None

    def _temperature(self, handle: Any) -> int | None:
        nv = self._nv
        sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        if self._temperature_v is not False and hasattr(nv, "nvmlDeviceGetTemperatureV"):
            try:
                value = nv.nvmlDeviceGetTemperatureV(handle, sensor)
            except Exception as e:
                if self._code(e) in (
                    self._codes["FUNCTION_NOT_FOUND"],
                    self._codes["ARGUMENT_VERSION_MISMATCH"],
                ):
                    self._temperature_v = False  # older driver: use the deprecated call below
                elif self._is_unsupported(e) or self._code(e) == self._codes["NO_PERMISSION"]:
                    return None
                else:
                    raise
            else:
                self._temperature_v = True
                return int(value)
        value = self._optional("nvmlDeviceGetTemperature", handle, sensor)
        return int(value) if value is not None else None

    def _mig_mode(self, handle: Any) -> bool | None:
        mode = self._optional("nvmlDeviceGetMigMode", handle)
        if mode is None:
            return None
        current = mode[0] if isinstance(mode, list | tuple) else mode
        return int(current) == int(getattr(self._nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def _process_list(self, handle: Any, fn_name: str) -> list[Any] | None:
        """One NVML process list; None when not supported. NoPermission propagates."""
        for name in (fn_name, f"{fn_name}_v2"):
            fn = getattr(self._nv, name, None)
            if fn is None:
                continue
            try:
                return list(fn(handle))
            except Exception as e:
                # the binding's default (v3) missing in an older driver: try the _v2 entry point
                if self._is_unsupported(e):
                    continue
                raise
        return None

    def _processes(self, handle: Any, seen_pids: set[int]) -> tuple[GpuProcess, ...] | None:
        try:
            compute = self._process_list(handle, "nvmlDeviceGetComputeRunningProcesses")
        except Exception as e:
            if self._code(e) == self._codes["NO_PERMISSION"]:
                return None
            raise
        if compute is None:
            return None
        try:
            graphics = self._process_list(handle, "nvmlDeviceGetGraphicsRunningProcesses") or []
        except Exception as e:
            if self._code(e) != self._codes["NO_PERMISSION"]:
                raise
            graphics = []
        merged: dict[int, tuple[int | None, ProcessKind]] = {}
        lists: tuple[tuple[list[Any], ProcessKind], ...] = ((compute, "compute"), (graphics, "graphics"))
        for procs, kind in lists:
            for p in procs:
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                used = int(used) if used is not None else None
                if pid in merged:
                    known = [u for u in (merged[pid][0], used) if u is not None]
                    merged[pid] = (max(known) if known else None, "compute+graphics")
                else:
                    merged[pid] = (used, kind)
        seen_pids.update(merged)
        return tuple(
            GpuProcess(pid=pid, name=self._process_name(pid), used_bytes=used, kind=kind)
            for pid, (used, kind) in sorted(merged.items())
        )

    def _process_name(self, pid: int) -> str | None:
        if pid in self._process_names:
            return self._process_names[pid]
        name: str | None = None
        try:
            full = self._optional("nvmlSystemGetProcessName", pid)
        except Exception:
            full = None
        if full:
            name = os.path.basename(_text(full).rstrip("/")) or None
        if name is None:
            try:
                name = (
                    (self._proc_root / str(pid) / "comm")
                    .read_text(encoding="utf-8", errors="replace")
                    .strip()
                )
            except OSError:
                name = None
        self._process_names[pid] = name or None
        return name or None
