"""A scripted GPU backend for tests, demos and ``--fake-gpus``: GPUs described by a JSON scenario.

A scenario (a file, a shipped name such as ``"rtx4090_browser"``, or a dict) is validated with pydantic; a
bad one raises :class:`~gpumem_gui.core.errors.GpumemInputError` naming the file and the field. Sizes are MiB
in the JSON (what ``nvidia-smi`` prints) and bytes in the snapshots. Each :meth:`FakeBackend.snapshot` call is
one *step*; a value given as a list changes per step, cycling or holding its last value at the end
(``at_end``). The scenario's keys, its models and :func:`load_scenario` are in
:mod:`gpumem_gui.hardware.fake_scenario` (re-exported here).
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gpumem_gui.hardware.backend import (
    CLOSED_REASON,
    FROM_ENV,
    GPU_LOST_ERROR,
    HardwareError,
    VisibleDevices,
    init_failure_reason,
    resolve_visible_devices,
    with_cuda_indices,
)
from gpumem_gui.hardware.fake_scenario import (
    FaultsSpec,
    GpuSpec,
    MiB,
    MigSpec,
    ProcessSpec,
    Scenario,
    UnsupportedField,
    load_scenario,
    scenarios_dir,
    shipped_scenarios,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuProcess, GpuSnapshot

T = TypeVar("T")

# DGX H100 PCI buses, a realistic default for up to 8 GPUs.
_DEFAULT_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

__all__ = [
    "FakeBackend",
    "FaultsSpec",
    "GpuSpec",
    "MiB",
    "MigSpec",
    "ProcessSpec",
    "Scenario",
    "UnsupportedField",
    "load_scenario",
    "scenarios_dir",
    "shipped_scenarios",
]


class FakeBackend:
    """GPUs from a scenario; one step per :meth:`snapshot` call.

    Args:
        scenario: a scenario dict, a JSON file, or a shipped scenario name.
        cuda_visible_devices: as for :class:`~gpumem_gui.hardware.nvml.NvmlBackend` (default: the
            environment's).
        clock: the time source for ``taken_at``.
    """

    def __init__(
        self,
        scenario: Path | str | Mapping[str, Any],
        *,
        cuda_visible_devices: VisibleDevices = FROM_ENV,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scenario, self.scenario_id = load_scenario(scenario)
        self.name = f"fake:{self.scenario_id}"
        self._cvd = cuda_visible_devices
        self._clock = clock
        self._lock = threading.Lock()
        self._step = 0
        self._closed = False

    @property
    def step(self) -> int:
        """How many snapshots were taken so far (the step the next snapshot shows)."""
        return self._step

    def reset(self) -> None:
        with self._lock:
            self._step = 0

    def close(self) -> None:
        self._closed = True

    def snapshot(self) -> GpuSnapshot:
        with self._lock:
            step = self._step
            self._step += 1
        sc = self.scenario
        taken_at = self._clock()
        if self._closed:
            return GpuSnapshot(taken_at=taken_at, backend=self.name, unavailable_reason=CLOSED_REASON)
        if sc.faults.nvml_init_error is not None:
            reason = init_failure_reason(sc.faults.nvml_init_error, "fake scenario")
            return GpuSnapshot(taken_at=taken_at, backend=self.name, unavailable_reason=reason)
        if step in sc.faults.raise_at_steps:
            raise HardwareError(f"Could not read the GPUs: injected fault at step {step} ({self.name}).")
        devices: list[GpuDevice] = []
        for i, gpu in enumerate(sc.gpus):
            devices.extend(self._gpu(i, gpu, step))
        visible = resolve_visible_devices(self._cvd)
        return GpuSnapshot(
            taken_at=taken_at,
            driver_version=sc.driver_version,
            cuda_driver_version=sc.cuda_driver_version,
            nvml_version=sc.nvml_version,
            devices=with_cuda_indices(devices, visible),
            visible_devices=visible,
            backend=self.name,
        )

    # ---- one step of one GPU -------------------------------------------------------------------------------

    def _at(self, value: T | Sequence[T], step: int) -> T:
        if not isinstance(value, list):
            return value  # type: ignore[return-value]
        if self.scenario.at_end == "cycle":
            return value[step % len(value)]
        return value[min(step, len(value) - 1)]

    def _processes(self, specs: list[ProcessSpec], step: int) -> list[GpuProcess]:
        out = []
        for p in specs:
            used = self._at(p.used_mib, step) if isinstance(p.used_mib, list) else p.used_mib
            if isinstance(p.used_mib, list) and used is None:
                continue  # not running at this step
            out.append(
                GpuProcess(
                    pid=p.pid, name=p.name, used_bytes=used * MiB if used is not None else None, kind=p.kind
                )
            )
        return out

    def _uuid(self, *parts: object) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "gpumem-fake:" + ":".join(map(str, parts))))

    def _memory(
        self, total_mib: int, reserved_mib: int, used_mib: int, unsupported: bool
    ) -> dict[str, int | None]:
        if unsupported:
            return {"total_bytes": None, "used_bytes": None, "free_bytes": None, "reserved_bytes": None}
        free = max(0, total_mib - reserved_mib - used_mib) * MiB
        if self.scenario.faults.memory_info_v1_only:
            # v1 counts what the driver reserves as used
            return {
                "total_bytes": total_mib * MiB,
                "used_bytes": min(total_mib, used_mib + reserved_mib) * MiB,
                "free_bytes": free,
                "reserved_bytes": None,
            }
        return {
            "total_bytes": total_mib * MiB,
            "used_bytes": used_mib * MiB,
            "free_bytes": free,
            "reserved_bytes": reserved_mib * MiB,
        }

    def _gpu(self, i: int, gpu: GpuSpec, step: int) -> list[GpuDevice]:
        uuid = gpu.uuid or f"GPU-{self._uuid(self.scenario_id, i)}"
        bus = _DEFAULT_BUSES[i] if i < len(_DEFAULT_BUSES) else 0x10 + i
        pci = None if "pci_bus_id" in gpu.not_supported else gpu.pci_bus_id or f"00000000:{bus:02X}:00.0"
        if gpu.lost_at_step is not None and step >= gpu.lost_at_step:
            return [
                GpuDevice(
                    index=i, uuid=uuid, name=gpu.name, pci_bus_id=pci, processes=None, error=GPU_LOST_ERROR
                )
            ]

        migs = (
            [self._mig(i, uuid, pci, j, m, step) for j, m in enumerate(gpu.mig_instances)]
            if gpu.in_mig_mode
            else []
        )
        procs = None if gpu.processes_denied else self._processes(gpu.processes, step)
        if gpu.used_mib is not None:
            used_mib = self._at(gpu.used_mib, step)
        else:
            used_mib = sum((p.used_bytes or 0) for p in procs or ()) // MiB
            used_mib += sum((m.used_bytes or 0) for m in migs) // MiB
        used_mib = min(used_mib, gpu.total_mib - gpu.reserved_mib)

        def value(field: str, v: T) -> T | None:
            return None if field in gpu.not_supported else v

        device = GpuDevice(
            index=i,
            uuid=uuid,
            name=gpu.name,
            pci_bus_id=pci,
            **self._memory(gpu.total_mib, gpu.reserved_mib, used_mib, "memory" in gpu.not_supported),
            utilization_percent=value("utilization_percent", self._at(gpu.utilization_percent, step)),
            temperature_c=value("temperature_c", self._at(gpu.temperature_c, step)),
            power_draw_w=value("power_draw_w", self._at(gpu.power_draw_w, step)),
            power_limit_w=value("power_limit_w", gpu.power_limit_w),
            processes=tuple(procs) if procs is not None else None,
            mig_mode=value("mig_mode", gpu.in_mig_mode),
        )
        return [device, *migs]

    def _mig(self, i: int, parent_uuid: str, pci: str | None, j: int, m: MigSpec, step: int) -> GpuDevice:
        procs = None if m.processes_denied else self._processes(m.processes, step)
        if m.used_mib is not None:
            used_mib = self._at(m.used_mib, step)
        else:
            used_mib = min(m.total_mib, sum((p.used_bytes or 0) for p in procs or ()) // MiB)
        parent_name = self.scenario.gpus[i].name
        return GpuDevice(
            index=j,
            uuid=m.uuid or f"MIG-{self._uuid(self.scenario_id, i, j)}",
            name=m.name or f"{parent_name} MIG {m.profile}",
            pci_bus_id=pci,
            **self._memory(m.total_mib, 0, used_mib, False),
            processes=tuple(procs) if procs is not None else None,
            is_mig_instance=True,
            parent_index=i,
            parent_uuid=parent_uuid,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
        )
