"""The NVML backend: live GPU memory from NVIDIA's driver. The ONLY module in gpumem that imports ``pynvml``.

``pynvml`` (from the ``nvidia-ml-py`` package) is taken by injection: ``NvmlBackend(nvml_module=fake)`` in
tests, and imported lazily, on the first snapshot, only when nothing was injected. NVML is initialised once,
under a lock, with ``NVML_INIT_FLAG_NO_GPUS`` (a machine with zero GPUs is a state, not an error), and shut
down once by :meth:`NvmlBackend.close` (also registered with :mod:`atexit`). The module object is then handed
to :mod:`~gpumem_gui.hardware.nvml_calls` (errors mapped to states), :mod:`~gpumem_gui.hardware.nvml_devices`
(one GPU, its MIG instances) and :mod:`~gpumem_gui.hardware.nvml_processes` (its processes), which read
through it and never import ``pynvml`` themselves.

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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpumem_gui.hardware.backend import (
    CLOSED_REASON,
    FROM_ENV,
    HardwareError,
    InitFailure,
    VisibleDevices,
    init_failure_reason,
    resolve_visible_devices,
    with_cuda_indices,
)
from gpumem_gui.hardware.nvml_calls import NvmlCalls, cuda_version_text, describe, text
from gpumem_gui.hardware.nvml_devices import DeviceReader
from gpumem_gui.hardware.snapshot import GpuSnapshot


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
        self._calls: NvmlCalls | None = None  # set once NVML's module is known
        self._devices: DeviceReader | None = None  # set once NVML is up
        self._driver_version: str | None = None
        self._cuda_driver_version: str | None = None
        self._nvml_version: str | None = None

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
        calls = self._calls = NvmlCalls(nv)
        try:
            init_with_flags = getattr(nv, "nvmlInitWithFlags", None)
            no_gpus = getattr(nv, "NVML_INIT_FLAG_NO_GPUS", None)
            if init_with_flags is not None and no_gpus is not None:
                init_with_flags(no_gpus)
            else:
                nv.nvmlInit()
        except Exception as e:
            return self._fail(calls.init_reason(e))
        self._state = "ready"
        atexit.register(self.close)
        self._devices = DeviceReader(calls, self._proc_root)
        self._driver_version = calls.fact("nvmlSystemGetDriverVersion", text)
        cuda = calls.fact("nvmlSystemGetCudaDriverVersion_v2", int)
        if cuda is None:
            cuda = calls.fact("nvmlSystemGetCudaDriverVersion", int)
        self._cuda_driver_version = cuda_version_text(cuda) if cuda else None
        self._nvml_version = calls.fact("nvmlSystemGetNVMLVersion", text)
        return True

    def _fail(self, reason: str) -> bool:
        self._state = "failed"
        self._failure_reason = reason
        return False

    # ---- snapshot ----------------------------------------------------------------------------------------

    def snapshot(self) -> GpuSnapshot:
        """Poll every GPU (and MIG instance) once."""
        with self._lock:
            taken_at = self._clock()
            if not self._ensure_init():
                reason = CLOSED_REASON if self._state == "closed" else self._failure_reason
                return GpuSnapshot(taken_at=taken_at, backend=self.name, unavailable_reason=reason)
            assert self._calls is not None and self._devices is not None
            visible = resolve_visible_devices(self._cvd)
            try:
                devices = self._devices.read_devices()
            except HardwareError:
                raise
            except Exception as e:
                if self._calls.is_nvml_error(e):
                    raise HardwareError(f"Could not read the GPUs: NVML says '{describe(e)}'.") from e
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
