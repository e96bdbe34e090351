"""GPU backends (NVML; Prometheus with dcgm-exporter for a cluster; fake; null) behind one protocol. No Qt
here; only the NVML module imports pynvml.

::

    from gpumem_gui.hardware import default_backend, format_snapshot

    backend = default_backend()                 # NVML; default_backend("a100_mig") for a fake
    snap = backend.snapshot()                   # immutable GpuSnapshot; never raises for "no driver"
    print(format_snapshot(snap))
    backend.close()

``pynvml`` is imported only when an :class:`NvmlBackend` takes its first snapshot, so importing this package
costs nothing on a machine without NVIDIA's driver.
"""

from __future__ import annotations

from pathlib import Path

from gpumem_gui.hardware.backend import (
    FROM_ENV,
    GPU_LOST_ERROR,
    GpuBackend,
    HardwareError,
    InitFailure,
    NullBackend,
    init_failure_reason,
    parse_cuda_visible_devices,
    with_cuda_indices,
)
from gpumem_gui.hardware.fake import FakeBackend, load_scenario, scenarios_dir, shipped_scenarios
from gpumem_gui.hardware.history import MemoryHistory
from gpumem_gui.hardware.nvml import NvmlBackend
from gpumem_gui.hardware.prometheus import PrometheusBackend
from gpumem_gui.hardware.prometheus_config import PrometheusConfig, make_prometheus_config
from gpumem_gui.hardware.report import format_snapshot, snapshot_to_json
from gpumem_gui.hardware.snapshot import GpuDevice, GpuProcess, GpuSnapshot

__all__ = [
    "FROM_ENV",
    "GPU_LOST_ERROR",
    "FakeBackend",
    "GpuBackend",
    "GpuDevice",
    "GpuProcess",
    "GpuSnapshot",
    "HardwareError",
    "InitFailure",
    "MemoryHistory",
    "NullBackend",
    "NvmlBackend",
    "PrometheusBackend",
    "PrometheusConfig",
    "default_backend",
    "format_snapshot",
    "init_failure_reason",
    "load_scenario",
    "make_prometheus_config",
    "parse_cuda_visible_devices",
    "scenarios_dir",
    "shipped_scenarios",
    "snapshot_to_json",
    "with_cuda_indices",
]


def default_backend(fake_scenario: Path | str | None = None) -> GpuBackend:
    """A :class:`FakeBackend` for ``fake_scenario`` (a file or a shipped name), else an :class:`NvmlBackend`.

    A bad scenario raises :class:`~gpumem_gui.core.errors.GpumemInputError`. The NVML backend starts lazily
    and reports a missing driver in its snapshots, so this never fails for lack of a GPU.
    """
    if fake_scenario is not None:
        return FakeBackend(fake_scenario)
    return NvmlBackend()
