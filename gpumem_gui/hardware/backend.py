"""The backend protocol, its one error type, the null backend, and CUDA's device numbering.

Every GPU backend (NVML, fake, null) satisfies :class:`GpuBackend`: ``snapshot()`` returns an immutable
:class:`~gpumem_gui.hardware.snapshot.GpuSnapshot` and ``close()`` releases what it holds. A backend that
cannot read GPUs at all does not raise: its snapshot carries ``unavailable_reason``. What does escape is a
:class:`HardwareError` with a ``reason`` a person understands (the NVML boundary converts every library
error into it), so callers catch exactly one type.

:func:`parse_cuda_visible_devices` numbers devices the way CUDA does under ``CUDA_VISIBLE_DEVICES``:

* unset (``None``): every GPU, in order; an empty string: no GPU at all;
* otherwise a comma-separated list of integer indices *or* UUIDs (``GPU-…``, full or any prefix that names
  one GPU; ``MIG-…`` for a MIG instance, also in the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form); the first
  entry sets which kind, and a later entry of the other kind is invalid;
* integers are read like C ``strtoul`` (``"1gpu"`` is 1, surrounding blanks are ignored);
* parsing stops at the first invalid entry (negative, out of range, unknown or ambiguous UUID) and CUDA
  ignores the rest: ``"0,2,-1,1"`` makes GPUs 0 and 2 visible;
* a device named twice makes the whole list invalid, so CUDA sees no device;
* a CUDA process enumerates at most one MIG device: a listed MIG instance, or the first instance of the
  first listed GPU that is in MIG mode (then the GPUs without MIG are not enumerated). This is the rule of
  CUDA 11/12 as nvitop models it; a GPU in MIG mode with no instance is skipped.

Integer indices are taken in NVML (PCI bus) order, which is CUDA's order with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default "fastest first" order differs only on machines that mix
GPU models.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from gpumem_gui.core import GpumemError
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot

# ---- the protocol and its error -----------------------------------------------------------------------


@runtime_checkable
class GpuBackend(Protocol):
    """Anything that can take GPU snapshots. Implementations must be safe to call from one worker thread."""

    name: str

    def snapshot(self) -> GpuSnapshot:
        """Poll the GPUs once. Raises only :class:`HardwareError`."""
        ...

    def close(self) -> None:
        """Release the library/handles; safe to call more than once."""
        ...


class HardwareError(GpumemError):
    """The one error a GPU backend raises: ``reason`` is a sentence a person can act on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# ---- reasons, shared by the NVML and fake backends ------------------------------------------------------

_CATALOG_HINT = "gpumem works without it: check fit against a catalog GPU instead."


def _nvml_library_name() -> str:
    return "nvml.dll" if sys.platform.startswith("win") else "libnvidia-ml.so.1"


class InitFailure(enum.StrEnum):
    """Why NVML could not start; each has a reason text (:func:`init_failure_reason`)."""

    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    LIB_RM_VERSION_MISMATCH = "lib_rm_version_mismatch"
    NO_PERMISSION = "no_permission"
    BINDING_MISSING = "binding_missing"
    UNKNOWN = "unknown"


def init_failure_reason(kind: InitFailure | str, detail: str | None = None) -> str:
    """The sentence shown when NVML cannot start for ``kind``; ``detail`` is the library's own message."""
    kind = InitFailure(kind)
    lib = _nvml_library_name()
    if kind is InitFailure.LIBRARY_NOT_FOUND:
        return f"No NVIDIA driver found: the NVML library ({lib}) is not installed. {_CATALOG_HINT}"
    if kind is InitFailure.DRIVER_NOT_LOADED:
        return (
            "The NVIDIA driver is installed but not running (its kernel module is not loaded). "
            "Load it or reboot to see live GPU memory. " + _CATALOG_HINT
        )
    if kind is InitFailure.LIB_RM_VERSION_MISMATCH:
        return (
            "The NVIDIA driver was upgraded but the old kernel module is still loaded (NVML/driver version "
            "mismatch). Reboot, or reload the nvidia kernel modules, to see live GPU memory. " + _CATALOG_HINT
        )
    if kind is InitFailure.NO_PERMISSION:
        return (
            "Not allowed to talk to the NVIDIA driver (no permission on /dev/nvidia*). Ask an administrator "
            "to add you to the group that owns those devices. " + _CATALOG_HINT
        )
    if kind is InitFailure.BINDING_MISSING:
        return (
            "The Python package nvidia-ml-py (module pynvml) is not installed, so live GPU memory cannot be "
            "read. Install it with 'pip install nvidia-ml-py'. " + _CATALOG_HINT
        )
    extra = f" ({detail})" if detail else ""
    return f"The NVIDIA driver library could not start{extra}. {_CATALOG_HINT}"


GPU_LOST_ERROR = "GPU is lost: it fell off the bus or stopped responding; a GPU reset or a reboot is needed."
CLOSED_REASON = "The GPU backend was closed."


# ---- the null backend -----------------------------------------------------------------------------------


class NullBackend:
    """A backend with no GPUs: every snapshot is empty and carries ``reason``."""

    def __init__(self, reason: str, *, name: str = "null") -> None:
        self.name = name
        self.reason = reason

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(taken_at=time.time(), backend=self.name, unavailable_reason=self.reason)

    def close(self) -> None:
        return None


# ---- CUDA_VISIBLE_DEVICES -------------------------------------------------------------------------------


class _FromEnv(enum.Enum):
    FROM_ENV = "from_env"


FROM_ENV = _FromEnv.FROM_ENV
"""Default for a backend's ``cuda_visible_devices``: read ``CUDA_VISIBLE_DEVICES`` at each snapshot."""

VisibleDevices = str | None | _FromEnv


def resolve_visible_devices(value: VisibleDevices) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` value to use: ``value``, or the environment's for :data:`FROM_ENV`."""
    if value is FROM_ENV:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    assert not isinstance(value, _FromEnv)
    return value


class _Invalid(Exception):
    """An entry CUDA would reject: parsing stops here."""


def _strtoul(token: str) -> int:
    """C ``strtoul`` on one entry: a sign and digits count, the rest is ignored; no digits is invalid."""
    s = token.strip()
    sign = 1
    if s[:1] in ("+", "-"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    digits = ""
    for ch in s:
        if ch not in "0123456789":  # ASCII only: str.isdigit() also takes '²', which int() refuses
            break
        digits += ch
    if not digits:
        raise _Invalid(token)
    # strtoul saturates at ULONG_MAX (C11 7.22.1.4): any index that long is out of range, and converting a
    # 5,000-digit string would hit Python's int-digit limit
    return sign * (1 << 64 if len(digits.lstrip("0")) > 20 else int(digits))


def _unique_prefix(prefix: str, candidates: Mapping[str, GpuDevice]) -> GpuDevice:
    """The one device whose UUID starts with ``prefix`` (case-insensitive); otherwise invalid."""
    p = prefix.lower()
    hits = [d for u, d in candidates.items() if u.lower().startswith(p)]
    if len(hits) != 1:
        raise _Invalid(prefix)
    return hits[0]


def parse_cuda_visible_devices(value: str | None, devices: Sequence[GpuDevice]) -> dict[str, int]:
    """Map each device CUDA would see to its CUDA index, following CUDA's rules (see the module docstring).

    ``devices`` are the physical GPUs (in NVML order) and their MIG instances, as in a snapshot. The
    result maps :attr:`GpuDevice.key` (``"0"``, ``"0:1"``) to the CUDA index, in CUDA order; devices not
    in it are hidden from CUDA.
    """
    physical = sorted((d for d in devices if not d.is_mig_instance), key=lambda d: d.index)
    migs: dict[int, list[GpuDevice]] = {}
    for d in devices:
        if d.is_mig_instance and d.parent_index is not None:
            migs.setdefault(d.parent_index, []).append(d)
    for lst in migs.values():
        lst.sort(key=lambda d: d.index)

    if value is None:
        listed: list[GpuDevice] = list(physical)
    else:
        listed = []
        if value.strip():
            parsed = _parse_entries(value, physical, migs)
            if parsed is None:
                return {}
            listed = parsed

    return {d.key: i for i, d in enumerate(_apply_mig_rule(listed, migs))}


def _parse_entries(
    value: str, physical: list[GpuDevice], migs: Mapping[int, list[GpuDevice]]
) -> list[GpuDevice] | None:
    """The listed devices up to the first invalid entry; None when a device is listed twice."""
    by_gpu_uuid = {d.uuid: d for d in physical if d.uuid}
    by_mig_uuid = {d.uuid: d for lst in migs.values() for d in lst if d.uuid}
    listed: list[GpuDevice] = []
    use_uuids: bool | None = None
    for raw in value.split(","):
        token = raw.strip()
        is_uuid = token[:4].upper() in ("GPU-", "MIG-")
        if use_uuids is None:
            use_uuids = is_uuid
        try:
            if is_uuid != use_uuids:
                raise _Invalid(token)
            device = (
                _resolve_uuid(token, by_gpu_uuid, by_mig_uuid, migs)
                if is_uuid
                else _resolve_index(token, physical)
            )
        except _Invalid:
            break
        if any(d.key == device.key for d in listed):
            return None
        listed.append(device)
    return listed


def _resolve_index(token: str, physical: list[GpuDevice]) -> GpuDevice:
    n = _strtoul(token)
    if n < 0 or n >= len(physical):
        raise _Invalid(token)
    return physical[n]


def _resolve_uuid(
    token: str,
    by_gpu_uuid: Mapping[str, GpuDevice],
    by_mig_uuid: Mapping[str, GpuDevice],
    migs: Mapping[int, list[GpuDevice]],
) -> GpuDevice:
    if token[:4].upper() == "GPU-":
        return _unique_prefix(token, by_gpu_uuid)
    # MIG-GPU-<gpu uuid>/<gi>/<ci> (R450-R465) or MIG-<mig uuid> (R470+)
    rest = token[4:]
    if rest[:4].upper() == "GPU-":
        parts = rest.split("/")
        if len(parts) != 3:
            raise _Invalid(token)
        parent = _unique_prefix(parts[0], by_gpu_uuid)
        try:
            gi, ci = int(parts[1]), int(parts[2])
        except ValueError as e:
            raise _Invalid(token) from e
        for d in migs.get(parent.index, []):
            if d.gpu_instance_id == gi and d.compute_instance_id == ci:
                return d
        raise _Invalid(token)
    return _unique_prefix(token, by_mig_uuid)


def _apply_mig_rule(listed: list[GpuDevice], migs: Mapping[int, list[GpuDevice]]) -> list[GpuDevice]:
    """CUDA 11/12 enumerate at most one MIG device (see the module docstring)."""
    mig_listed = [d for d in listed if d.is_mig_instance]
    if mig_listed:
        return mig_listed[:1]
    out: list[GpuDevice] = []
    for d in listed:
        if d.mig_mode:
            instances = migs.get(d.index, [])
            if instances:
                return instances[:1]
            continue
        out.append(d)
    return out


def with_cuda_indices(devices: Sequence[GpuDevice], value: str | None) -> tuple[GpuDevice, ...]:
    """``devices`` with :attr:`GpuDevice.cuda_index` filled in for ``CUDA_VISIBLE_DEVICES=value``."""
    mapping = parse_cuda_visible_devices(value, devices)
    return tuple(
        d if d.cuda_index == mapping.get(d.key) else d.model_copy(update={"cuda_index": mapping.get(d.key)})
        for d in devices
    )
