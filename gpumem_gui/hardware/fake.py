"""A scripted GPU backend for tests, demos and ``--fake-gpus``: GPUs described by a JSON scenario.

A scenario (a file, a shipped name such as ``"rtx4090_browser"``, or a dict) is validated with pydantic; a
bad one raises :class:`~gpumem_gui.core.errors.GpumemInputError` naming the file and the field. Sizes are MiB
in the JSON (what ``nvidia-smi`` prints) and bytes in the snapshots. Each :meth:`FakeBackend.snapshot` call is
one *step*; a value given as a list changes per step, cycling or holding its last value at the end
(``at_end``).

Scenario keys (all but ``gpus[].name`` and ``gpus[].total_mib`` optional)::

    {
      "version": 1, "description": "...", "at_end": "cycle" | "hold",
      "driver_version": "550.54.15", "cuda_driver_version": "12.4", "nvml_version": "12.550.54.15",
      "faults": {
        "nvml_init_error": null | "library_not_found" | "driver_not_loaded" | "lib_rm_version_mismatch"
                           | "no_permission" | "unknown",
        "memory_info_v1_only": false,      # the driver has no memory info v2: reserved unknown
        "raise_at_steps": []               # snapshot() raises HardwareError at these steps
      },
      "gpus": [{
        "name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-…", "pci_bus_id": "00000000:01:00.0",
        "total_mib": 24564, "reserved_mib": 0,
        "used_mib": 1024 | [steps…],       # default: what the processes (and MIG instances) hold
        "utilization_percent": 0 | [steps…], "temperature_c": 40 | [steps…],
        "power_draw_w": 50.0 | [steps…], "power_limit_w": 450.0,
        "processes": [{"pid": 4242, "name": "firefox", "used_mib": 1024 | [steps, null = not running],
                       "kind": "compute" | "graphics" | "compute+graphics"}],
        "processes_denied": false,         # the process list needs privileges: processes unknown
        "not_supported": ["utilization_percent", "temperature_c", "power_draw_w", "power_limit_w",
                          "memory", "mig_mode", "pci_bus_id"],
        "lost_at_step": null | 3,          # from this step on the GPU is lost
        "mig_mode": null,                  # default: true when mig_instances are given
        "mig_instances": [{"profile": "3g.40gb", "total_mib": 40192, "gpu_instance_id": 2,
                           "compute_instance_id": 0, "used_mib": …, "processes": […],
                           "processes_denied": false, "uuid": "MIG-…", "name": "…"}]
      }]
    }
"""

from __future__ import annotations

import json
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpumem_gui.core import GpumemInputError, describe_validation_error, resources_dir
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

MiB = 1 << 20
T = TypeVar("T")

NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]
PercentInt = Annotated[int, Field(ge=0, le=100)]
NonNegFloat = Annotated[float, Field(ge=0)]

# DGX H100 PCI buses, a realistic default for up to 8 GPUs.
_DEFAULT_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

UnsupportedField = Literal[
    "utilization_percent",
    "temperature_c",
    "power_draw_w",
    "power_limit_w",
    "memory",
    "mig_mode",
    "pci_bus_id",
]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProcessSpec(_Spec):
    pid: PositiveInt
    name: str | None = None
    used_mib: NonNegInt | list[NonNegInt | None] | None = Field(
        None, description="MiB per step; a null step means the process is not running then"
    )
    kind: ProcessKind = "compute"


class MigSpec(_Spec):
    profile: str = Field(min_length=1, description="e.g. '3g.40gb'")
    name: str | None = None
    uuid: str | None = None
    total_mib: PositiveInt
    used_mib: NonNegInt | list[NonNegInt] | None = None
    gpu_instance_id: NonNegInt
    compute_instance_id: NonNegInt = 0
    processes: list[ProcessSpec] = []
    processes_denied: bool = False

    @model_validator(mode="after")
    def _check(self) -> MigSpec:
        _check_used(self.used_mib, self.total_mib, 0)
        return self


class GpuSpec(_Spec):
    name: str = Field(min_length=1)
    uuid: str | None = None
    pci_bus_id: str | None = None
    total_mib: PositiveInt
    reserved_mib: NonNegInt = 0
    used_mib: NonNegInt | list[NonNegInt] | None = None
    utilization_percent: PercentInt | list[PercentInt] = 0
    temperature_c: int | list[int] = 40
    power_draw_w: NonNegFloat | list[NonNegFloat] = 50.0
    power_limit_w: NonNegFloat = 450.0
    processes: list[ProcessSpec] = []
    processes_denied: bool = False
    not_supported: list[UnsupportedField] = []
    lost_at_step: NonNegInt | None = None
    mig_mode: bool | None = None
    mig_instances: list[MigSpec] = []

    @model_validator(mode="after")
    def _check(self) -> GpuSpec:
        if self.reserved_mib > self.total_mib:
            raise ValueError(f"reserved_mib ({self.reserved_mib}) is more than total_mib ({self.total_mib})")
        _check_used(self.used_mib, self.total_mib, self.reserved_mib)
        mig_total = sum(m.total_mib for m in self.mig_instances)
        if mig_total > self.total_mib:
            raise ValueError(
                f"the MIG instances hold {mig_total} MiB, more than total_mib ({self.total_mib})"
            )
        if self.mig_mode is False and self.mig_instances:
            raise ValueError("mig_instances given but mig_mode is false")
        slots = [(m.gpu_instance_id, m.compute_instance_id) for m in self.mig_instances]
        if len(set(slots)) != len(slots):
            raise ValueError("two MIG instances share a gpu_instance_id/compute_instance_id pair")
        return self

    @property
    def in_mig_mode(self) -> bool:
        return self.mig_mode if self.mig_mode is not None else bool(self.mig_instances)


class FaultsSpec(_Spec):
    nvml_init_error: InitFailure | None = None
    memory_info_v1_only: bool = False
    raise_at_steps: list[NonNegInt] = []


class Scenario(_Spec):
    version: Literal[1] = 1
    description: str = ""
    at_end: Literal["cycle", "hold"] = "cycle"
    driver_version: str = "550.54.15"
    cuda_driver_version: str = "12.4"
    nvml_version: str = "12.550.54.15"
    faults: FaultsSpec = FaultsSpec()
    gpus: list[GpuSpec] = []


def _check_used(used: int | list[int] | None, total: int, reserved: int) -> None:
    values = used if isinstance(used, list) else [used] if used is not None else []
    for i, v in enumerate(values):
        if v + reserved > total:
            where = f"step {i}: " if isinstance(used, list) else ""
            raise ValueError(f"{where}used_mib {v} + reserved_mib {reserved} is more than total_mib {total}")


# ---- loading ----------------------------------------------------------------------------------------------


def scenarios_dir() -> Path:
    """The folder of the shipped scenarios (``resources/fake_gpus``)."""
    return resources_dir() / "fake_gpus"


def shipped_scenarios() -> list[str]:
    """Names of the shipped scenarios, e.g. ``['8xh100_busy', 'a100_mig', …]``."""
    folder = scenarios_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def load_scenario(source: Path | str | Mapping[str, Any]) -> tuple[Scenario, str]:
    """Read and validate a scenario; returns it with a short id (file stem, or ``"inline"`` for a dict).

    ``source`` is a dict, a JSON file path, or the name of a shipped scenario (``"a100_mig"``).
    """
    if isinstance(source, Mapping):
        try:
            return Scenario.model_validate(dict(source)), "inline"
        except ValidationError as e:
            raise describe_validation_error(e, source="fake GPU scenario") from e
    path = Path(source)
    if not path.is_file():
        shipped = scenarios_dir() / f"{path.name.removesuffix('.json')}.json"
        if path.parent == Path(".") and shipped.is_file():
            path = shipped
        else:
            names = ", ".join(shipped_scenarios()) or "none"
            raise GpumemInputError(
                f"no such fake GPU scenario file (shipped scenarios: {names})", source=str(source)
            )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise GpumemInputError(f"cannot read: {e.strerror or e}", source=str(path)) from e
    except UnicodeDecodeError as e:
        raise GpumemInputError("not UTF-8 text", source=str(path)) from e
    except json.JSONDecodeError as e:
        raise GpumemInputError(
            f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})", source=str(path)
        ) from e
    if not isinstance(doc, dict):
        raise GpumemInputError("a scenario must be a JSON object", source=str(path))
    try:
        return Scenario.model_validate(doc), path.stem
    except ValidationError as e:
        raise describe_validation_error(e, source=str(path)) from e


# ---- the backend ------------------------------------------------------------------------------------------


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
