"""A cluster snapshot as the core's placement input: the GPUs that can take a rank now."""

from __future__ import annotations

from gpumem_gui.core import ClusterGpu
from gpumem_gui.hardware.snapshot import GpuSnapshot


def cluster_gpus(snap: GpuSnapshot) -> tuple[ClusterGpu, ...]:
    """Every GPU or MIG instance of ``snap`` with a host, known free memory, no error and fresh samples. A GPU
    in MIG mode is placed through its instances only (CUDA sees an instance, not the GPU, in MIG mode)."""
    out = []
    for d in snap.devices:
        if d.host is None or not d.ok or d.stale or d.free_bytes is None or not d.total_bytes:
            continue
        if d.mig_mode and snap.mig_instances(d.index, d.host):
            continue
        out.append(
            ClusterGpu(
                host=d.host,
                key=d.key,
                index=d.parent_index if d.is_mig_instance and d.parent_index is not None else d.index,
                name=d.name,
                total_bytes=d.total_bytes,
                cuda_bytes=d.cuda_total_bytes,
                free_bytes=d.free_bytes,
                mig_instance=d.is_mig_instance,
            )
        )
    return tuple(out)
