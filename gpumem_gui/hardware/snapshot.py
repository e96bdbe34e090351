"""Immutable GPU snapshots: what one poll of a backend saw, in bytes, safe to hand to any thread.

A :class:`GpuSnapshot` is the only thing that crosses from a backend (NVML, fake, null) to the rest of the
app. Every field that a driver may not report is ``None`` ("unknown / not supported"), never ``0``, ``-1`` or
``"N/A"``; sizes are ``int`` bytes, power is watts, temperature degrees Celsius.

A lost GPU stays in :attr:`GpuSnapshot.devices` with :attr:`GpuDevice.error` set and no numbers, so the UI can
show the card and its problem while the other GPUs keep reporting. When NVML cannot be used at all,
``devices`` is empty and :attr:`GpuSnapshot.unavailable_reason` says why, in words a person can act on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Percent = Annotated[int, Field(ge=0, le=100)]

ProcessKind = Literal["compute", "graphics", "compute+graphics"]


class _Frozen(BaseModel):
    """Immutable, no unknown fields (the style of every core model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuProcess(_Frozen):
    """One process holding memory on a GPU (or on one MIG instance)."""

    pid: NonNegInt
    name: str | None = Field(None, description="executable name; None when it could not be found")
    used_bytes: NonNegInt | None = Field(
        None,
        description="GPU memory of this process; None when the driver does not say (e.g. Windows WDDM)",
    )
    kind: ProcessKind = Field("compute", description="which NVML process list(s) it was in")


class GpuDevice(_Frozen):
    """One physical GPU, or one MIG instance of a GPU, as seen in one poll.

    ``index`` is the NVML index of a physical GPU; for a MIG instance it is the MIG device index within its
    parent (``parent_index``), and :attr:`key` (``"0:1"``) names it uniquely.
    """

    index: NonNegInt
    uuid: str | None = Field(None, description="'GPU-…' or, for a MIG instance, 'MIG-…'")
    name: str = Field(description="e.g. 'NVIDIA GeForce RTX 4090'; 'unknown GPU' when it could not be read")
    pci_bus_id: str | None = None
    total_bytes: NonNegInt | None = None
    used_bytes: NonNegInt | None = Field(
        None, description="memory info v2: allocated by processes/contexts; v1: also includes reserved_bytes"
    )
    free_bytes: NonNegInt | None = None
    reserved_bytes: NonNegInt | None = Field(
        None, description="held by the driver/firmware; None when the driver only has memory info v1"
    )
    utilization_percent: Percent | None = None
    temperature_c: int | None = None
    power_draw_w: NonNegFloat | None = None
    power_limit_w: NonNegFloat | None = None
    processes: tuple[GpuProcess, ...] | None = Field(
        (), description="None when the driver denied the process list (permissions, MIG parent)"
    )
    mig_mode: bool | None = Field(None, description="MIG mode of a physical GPU; None when not supported")
    is_mig_instance: bool = False
    parent_index: NonNegInt | None = None
    parent_uuid: str | None = None
    gpu_instance_id: NonNegInt | None = Field(None, description="MIG GPU instance id (GI)")
    compute_instance_id: NonNegInt | None = Field(None, description="MIG compute instance id (CI)")
    error: str | None = Field(
        None, description="set when this GPU failed (e.g. lost); then no numbers are given"
    )
    cuda_index: NonNegInt | None = Field(
        None, description="index CUDA gives it under CUDA_VISIBLE_DEVICES; None when hidden from CUDA"
    )
    host: str | None = Field(
        None, description="the host of a cluster GPU (dcgm-exporter's Hostname label); None on this machine"
    )
    sample_age_s: NonNegFloat | None = Field(
        None, description="cluster: age of this GPU's newest sample when the poll was taken, in seconds"
    )
    stale: bool = Field(
        False, description="cluster: its samples are older than the scrape interval allows (shown greyed)"
    )
    workloads: tuple[str, ...] = Field(
        (), description="cluster on Kubernetes: 'namespace/pod/container' of each workload using it"
    )

    @model_validator(mode="after")
    def _check(self) -> GpuDevice:
        if self.is_mig_instance and self.parent_index is None:
            raise ValueError("a MIG instance needs parent_index")
        if not self.is_mig_instance and self.parent_index is not None:
            raise ValueError("parent_index is only for MIG instances")
        return self

    @property
    def key(self) -> str:
        """Stable name of this device: ``"0"`` for GPU 0, ``"0:1"`` for its MIG device 1; on a cluster the
        host comes first (``"node-a/0"``, ``"node-a/0:1"``)."""
        local = f"{self.parent_index}:{self.index}" if self.is_mig_instance else str(self.index)
        return local if self.host is None else f"{self.host}/{local}"

    @property
    def local_key(self) -> str:
        """:attr:`key` without the host: ``"0"`` or ``"0:1"``."""
        return f"{self.parent_index}:{self.index}" if self.is_mig_instance else str(self.index)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cuda_total_bytes(self) -> int | None:
        """The total CUDA reports (what the engines allocate from and a verdict checks against): the total
        less the driver's reserve (the core's ``driver_gpu_memory``); None when the total is not known."""
        if not self.total_bytes:
            return None
        from gpumem_gui.core import driver_gpu_memory

        return driver_gpu_memory(self.total_bytes, self.reserved_bytes).cuda_bytes

    @property
    def process_used_bytes(self) -> int | None:
        """Sum of the memory the listed processes hold, or None when unknown."""
        if self.processes is None:
            return None
        return sum(p.used_bytes or 0 for p in self.processes)


class GpuSnapshot(_Frozen):
    """What one poll saw: every GPU (and MIG instance) with its memory, plus driver facts."""

    taken_at: float = Field(description="time.time() when the poll was taken")
    driver_version: str | None = None
    cuda_driver_version: str | None = Field(
        None, description="highest CUDA version the driver supports, e.g. '12.4'"
    )
    nvml_version: str | None = None
    devices: tuple[GpuDevice, ...] = ()
    visible_devices: str | None = Field(
        None, description="the CUDA_VISIBLE_DEVICES value used; None when unset"
    )
    backend: str = Field(description="'nvml', 'fake:<scenario>', 'prometheus:<url>' or 'null'")
    unavailable_reason: str | None = Field(
        None,
        description="set (and devices empty) when live GPU data cannot be read; words a person understands",
    )
    notes: tuple[str, ...] = Field(
        (), description="what a person should know about this poll (e.g. a cluster listing cut at its limit)"
    )

    @model_validator(mode="after")
    def _check(self) -> GpuSnapshot:
        if self.unavailable_reason is not None and self.devices:
            raise ValueError("an unavailable snapshot has no devices")
        keys = [d.key for d in self.devices]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate device keys: {keys}")
        return self

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def device(self, key: str) -> GpuDevice | None:
        """The device with :attr:`GpuDevice.key` ``key`` (``"0"``, ``"0:1"``), or None."""
        for d in self.devices:
            if d.key == key:
                return d
        return None

    @property
    def physical_devices(self) -> tuple[GpuDevice, ...]:
        return tuple(d for d in self.devices if not d.is_mig_instance)

    def mig_instances(self, parent_index: int, host: str | None = None) -> tuple[GpuDevice, ...]:
        return tuple(
            d for d in self.devices if d.is_mig_instance and d.parent_index == parent_index and d.host == host
        )

    @property
    def hosts(self) -> tuple[str, ...]:
        """The cluster hosts in this snapshot, in the order their GPUs appear (empty on this machine)."""
        return tuple(dict.fromkeys(d.host for d in self.devices if d.host is not None))

    @property
    def cuda_devices(self) -> tuple[GpuDevice, ...]:
        """The devices CUDA would see, in CUDA order."""
        visible = [d for d in self.devices if d.cuda_index is not None]
        return tuple(sorted(visible, key=lambda d: d.cuda_index or 0))
