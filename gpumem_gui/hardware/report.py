"""GPU snapshots as JSON and as a readable table (what ``gpumem gpus`` prints).

:func:`snapshot_to_json` returns schema ``gpumem.gpus/1``. Its keys are stable: a key may be added, none is
renamed or removed without bumping the schema. Sizes are ``int`` bytes; ``null`` means unknown/not supported.

Top level:

* ``schema``: ``"gpumem.gpus/1"``
* ``taken_at``: seconds since the epoch (``time.time()``) when the poll was taken
* ``backend``: ``"nvml"``, ``"fake:<scenario>"``, ``"prometheus:<url>"`` or ``"null"``
* ``available``: false when live GPU data cannot be read (then ``devices`` is empty)
* ``unavailable_reason``: why not, in words a person can act on; ``null`` when available
* ``driver_version``: NVIDIA driver version, e.g. ``"550.54.15"``
* ``cuda_driver_version``: the highest CUDA version the driver supports, e.g. ``"12.4"``
* ``nvml_version``: NVML library version
* ``cuda_visible_devices``: the ``CUDA_VISIBLE_DEVICES`` value used; ``null`` when unset
* ``devices``: every GPU, each followed by its MIG instances
* ``notes``: what a person should know about this poll (e.g. a cluster listing cut at its limit)

Each device:

* ``key``: ``"0"`` for GPU 0, ``"0:1"`` for its MIG device 1; on a cluster ``"node-a/0"``, ``"node-a/0:1"``
* ``host``: the cluster host (dcgm-exporter's ``Hostname``); ``null`` on this machine
* ``sample_age_s``: cluster: age of the GPU's newest sample; ``stale``: older than the scrape interval allows
  (its numbers are the last ones seen); ``workloads``: ``"namespace/pod/container"`` using it (Kubernetes)
* ``index``: NVML index (for a MIG instance: its index within the parent)
* ``cuda_index``: index under ``CUDA_VISIBLE_DEVICES``; ``null`` when hidden from CUDA
* ``uuid``, ``name``, ``pci_bus_id`` (``"00000000:01:00.0"``)
* ``is_mig_instance``, ``parent_index``, ``parent_uuid``, ``gpu_instance_id``, ``compute_instance_id``: MIG
  identity; ``mig_mode``: a physical GPU's MIG mode
* ``total_bytes``, ``used_bytes``, ``free_bytes``, ``reserved_bytes``: memory; ``reserved_bytes`` (held by the
  driver/firmware) is ``null`` when the driver only has memory info v1, and ``used_bytes`` then includes it
* ``cuda_total_bytes``: the total CUDA reports (what the engines allocate from): ``total_bytes`` less
  ``reserved_bytes``, or by the GPU catalog's rule under memory info v1
* ``utilization_percent`` (0-100), ``temperature_c``, ``power_draw_w``, ``power_limit_w``
* ``processes``: ``[{pid, name, used_bytes, kind}]`` (``kind``: compute, graphics or compute+graphics), or
  ``null`` when the driver denied the list
* ``error``: set when the GPU failed (e.g. lost); its numbers are then ``null``
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core import GiB
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot

SCHEMA = "gpumem.gpus/1"


def _device_json(d: GpuDevice) -> dict[str, Any]:
    return {
        "key": d.key,
        "index": d.index,
        "cuda_index": d.cuda_index,
        "uuid": d.uuid,
        "name": d.name,
        "pci_bus_id": d.pci_bus_id,
        "is_mig_instance": d.is_mig_instance,
        "parent_index": d.parent_index,
        "parent_uuid": d.parent_uuid,
        "gpu_instance_id": d.gpu_instance_id,
        "compute_instance_id": d.compute_instance_id,
        "mig_mode": d.mig_mode,
        "total_bytes": d.total_bytes,
        "used_bytes": d.used_bytes,
        "free_bytes": d.free_bytes,
        "reserved_bytes": d.reserved_bytes,
        "utilization_percent": d.utilization_percent,
        "temperature_c": d.temperature_c,
        "power_draw_w": d.power_draw_w,
        "power_limit_w": d.power_limit_w,
        "processes": (
            None
            if d.processes is None
            else [
                {"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes, "kind": p.kind}
                for p in d.processes
            ]
        ),
        "error": d.error,
        "host": d.host,
        "sample_age_s": d.sample_age_s,
        "stale": d.stale,
        "workloads": list(d.workloads),
        "cuda_total_bytes": d.cuda_total_bytes,  # added with issue 33 (CUDA's total)
    }


def snapshot_to_json(snapshot: GpuSnapshot) -> dict[str, Any]:
    """The snapshot as a JSON-ready dict with the stable keys documented in this module."""
    return {
        "schema": SCHEMA,
        "taken_at": snapshot.taken_at,
        "backend": snapshot.backend,
        "available": snapshot.available,
        "unavailable_reason": snapshot.unavailable_reason,
        "driver_version": snapshot.driver_version,
        "cuda_driver_version": snapshot.cuda_driver_version,
        "nvml_version": snapshot.nvml_version,
        "cuda_visible_devices": snapshot.visible_devices,
        "devices": [_device_json(d) for d in snapshot.devices],
        "notes": list(snapshot.notes),
    }


# ---- text ---------------------------------------------------------------------------------------------


def age_words(seconds: float | None) -> str:
    """'last sample 42 s ago' (minutes and hours past 120 s and 120 min): a cluster GPU's sample age, as
    the CLI table, the lost-GPU message and the window's cluster cards all say it."""
    if seconds is None:
        return "no recent sample"
    s = round(seconds)
    if s < 120:
        return f"last sample {s} s ago"
    return f"last sample {s // 60} min ago" if s < 7200 else f"last sample {s // 3600} h ago"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f}"


def _opt(v: object, suffix: str = "") -> str:
    return "-" if v is None else f"{v}{suffix}"


def _row(d: GpuDevice) -> tuple[str, ...]:
    """One table row; on a cluster the second column is the host and the last the GPU's state."""
    key = f"  {d.local_key}" if d.is_mig_instance else d.local_key
    second = d.host if d.host is not None else _opt(d.cuda_index)
    if d.error is not None:
        return (key, second, d.name, f"ERROR: {d.error}", "", "", "", "")
    if d.host is not None:
        last = f"stale ({age_words(d.sample_age_s)})" if d.stale else "ok"
        if d.workloads:
            last += f", used by {', '.join(d.workloads)}"
    else:
        last = "denied" if d.processes is None else str(len(d.processes))
    return (
        key,
        second,
        d.name,
        f"{_gib(d.used_bytes)} / {_gib(d.total_bytes)} ({_gib(d.cuda_total_bytes)})",
        _gib(d.free_bytes),
        _opt(d.utilization_percent, "%"),
        _opt(d.temperature_c, "C"),
        last,
    )


def format_snapshot(snapshot: GpuSnapshot) -> str:
    """A readable table of the snapshot, or the reason there is none. Sizes in GiB (2^30 bytes)."""
    facts = [f"backend {snapshot.backend}"]
    if snapshot.driver_version:
        facts.append(f"driver {snapshot.driver_version}")
    if snapshot.cuda_driver_version:
        facts.append(f"CUDA {snapshot.cuda_driver_version}")
    if snapshot.visible_devices is not None:
        facts.append(f"CUDA_VISIBLE_DEVICES={snapshot.visible_devices!r}")
    head = ", ".join(facts)
    if not snapshot.available:
        return f"No live GPU data ({head}): {snapshot.unavailable_reason}"
    if not snapshot.devices:
        return f"No NVIDIA GPU found ({head})."

    cluster = bool(snapshot.hosts)
    # Total: nvidia-smi's (NVML / DCGM); in brackets the total CUDA reports, less the driver's reserve
    memory = "Used / Total (CUDA) GiB"
    header = ("GPU", "Host" if cluster else "CUDA", "Name", memory, "Free GiB", "Util", "Temp")
    header += ("State",) if cluster else ("Procs",)
    rows = [_row(d) for d in snapshot.devices]

    # an error message runs past its column instead of widening it
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            if not (i == 3 and cell.startswith("ERROR:")):
                widths[i] = max(widths[i], len(cell))
    right = {3, 4, 5, 6} if snapshot.hosts else {3, 4, 5, 6, 7}

    def line(cells: tuple[str, ...]) -> str:
        out = []
        for i, cell in enumerate(cells):
            if i == 3 and cell.startswith("ERROR:"):
                out.append(cell)
                break
            out.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [head, line(header), *(line(r) for r in rows), *(f"note: {n}" for n in snapshot.notes)]
    return "\n".join(lines)
