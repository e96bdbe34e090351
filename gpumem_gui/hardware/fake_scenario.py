"""Fake GPU scenarios for :class:`~gpumem_gui.hardware.fake.FakeBackend`: the pydantic models and loading.

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

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpumem_gui.core import GpumemInputError, describe_validation_error, resources_dir, short
from gpumem_gui.files import FileReadError, path_kind, read_json
from gpumem_gui.hardware.backend import InitFailure
from gpumem_gui.hardware.snapshot import ProcessKind

MiB = 1 << 20
# Largest scenario file read: the shipped ones are under 5 KB; a scripted day of 8 GPUs at one step a second
# (86,400 readings of ~6 characters each) is ~4 MB.
MAX_FAKE_SCENARIO_BYTES = 8 << 20

NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]
PercentInt = Annotated[int, Field(ge=0, le=100)]
NonNegFloat = Annotated[float, Field(ge=0)]


def _not_empty(value: Any) -> Any:
    if isinstance(value, list) and not value:  # a series with no step has no value for any step
        raise ValueError("an empty list: a reading given per step needs at least one step")
    return value


# A value, or a list of one value per step (at least one).
Series = BeforeValidator(_not_empty)

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
    used_mib: Annotated[NonNegInt | list[NonNegInt | None] | None, Series] = Field(
        None, description="MiB per step; a null step means the process is not running then"
    )
    kind: ProcessKind = "compute"


class MigSpec(_Spec):
    profile: str = Field(min_length=1, description="e.g. '3g.40gb'")
    name: str | None = None
    uuid: str | None = None
    total_mib: PositiveInt
    used_mib: Annotated[NonNegInt | list[NonNegInt] | None, Series] = None
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
    used_mib: Annotated[NonNegInt | list[NonNegInt] | None, Series] = None
    utilization_percent: Annotated[PercentInt | list[PercentInt], Series] = 0
    temperature_c: Annotated[int | list[int], Series] = 40
    power_draw_w: Annotated[NonNegFloat | list[NonNegFloat], Series] = 50.0
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
            raise ValueError(
                f"reserved_mib ({short(self.reserved_mib)}) is more than total_mib ({short(self.total_mib)})"
            )
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
            raise ValueError(
                f"{where}used_mib {short(v)} + reserved_mib {short(reserved)} is more than total_mib "
                f"{short(total)}"
            )


# ---- loading ----------------------------------------------------------------------------------------------


def scenarios_dir() -> Path:
    """The folder of the shipped scenarios (``resources/fake_gpus``)."""
    return resources_dir() / "fake_gpus"


def shipped_scenarios() -> list[str]:
    """Names of the shipped scenarios, e.g. ``['8xh100_busy', 'a100_mig', …]``."""
    folder = scenarios_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def _scenario_path(path: Path, source: object) -> Path:
    """``path`` when something is there, else the shipped scenario of that name; neither is an error."""
    if path_kind(path) != "missing":
        return path
    shipped = scenarios_dir() / f"{path.name.removesuffix('.json')}.json"
    if path.parent == Path(".") and path_kind(shipped) == "file":
        return shipped
    names = ", ".join(shipped_scenarios()) or "none"
    raise GpumemInputError(f"no such fake GPU scenario file (shipped scenarios: {names})", source=str(source))


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
    try:
        doc = read_json(_scenario_path(path, source), MAX_FAKE_SCENARIO_BYTES, "fake GPU scenario")
    except FileReadError as e:
        raise GpumemInputError(e.problem, source=e.path) from None
    if not isinstance(doc, dict):
        raise GpumemInputError("a scenario must be a JSON object", source=str(path))
    try:
        return Scenario.model_validate(doc), path.stem
    except ValidationError as e:
        raise describe_validation_error(e, source=str(path)) from e
