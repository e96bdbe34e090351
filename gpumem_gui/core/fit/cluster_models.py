"""The records of a cluster fit: the GPUs a cluster's monitoring reports (:class:`ClusterGpu`) and the
answer :func:`gpumem_gui.core.fit.cluster.cluster_fit` gives (:class:`ClusterFit`, its placements and the
room per host)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.spec.model import Frozen

NonNeg = Annotated[int, Field(ge=0)]


class ClusterGpu(Frozen):
    """One GPU (or MIG instance) of a cluster that can take a rank: its host, name and memory now."""

    host: str = Field(min_length=1, description="host name (dcgm-exporter's Hostname label)")
    key: str = Field(min_length=1, description="unique over the cluster: 'node-a/0', 'node-a/0:1' (MIG)")
    index: NonNeg = Field(
        description="the physical GPU's index on its host (the parent's for a MIG instance)"
    )
    name: str = Field(description="e.g. 'NVIDIA H100 80GB HBM3'")
    total_bytes: Annotated[int, Field(gt=0)] = Field(description="the framebuffer total (DCGM, nvidia-smi)")
    cuda_bytes: Annotated[int, Field(gt=0)] | None = Field(
        None, description="the total CUDA reports (the framebuffer less FB_RESERVED); None: total_bytes"
    )
    free_bytes: NonNeg
    mig_instance: bool = False

    @property
    def memory(self) -> GpuMemory:
        """Its two totals (the engines size from them; the plan is estimated once per distinct pair)."""
        return GpuMemory(
            driver_bytes=self.total_bytes,
            cuda_bytes=min(self.cuda_bytes or self.total_bytes, self.total_bytes),
        )


class PlacedRank(Frozen):
    """One rank of the plan on one GPU."""

    rank: NonNeg
    host: str
    index: NonNeg
    key: str
    needed_bytes: NonNeg
    free_bytes: NonNeg
    headroom_bytes: int = Field(description="free - margin - needed (never negative in a placement)")


class Placement(Frozen):
    """Every rank of the plan on a GPU of its own."""

    hosts: tuple[str, ...]
    gpus: tuple[PlacedRank, ...]
    headroom_bytes: int = Field(description="the smallest headroom over its GPUs")


class HostRoom(Frozen):
    """One host: how many of its GPUs could take one rank of the plan now."""

    host: str
    gpus: NonNeg = Field(description="GPUs and MIG instances it reports that are usable now")
    gpus_for_one_rank: NonNeg = Field(description="of those, how many have room for the plan's biggest rank")


class ClusterFit(Frozen):
    """The ranked placements of a run's whole plan on a cluster, or why there is none."""

    ranks: Annotated[int, Field(ge=1)]
    tp: Annotated[int, Field(ge=1)]
    tp_across_hosts: bool
    margin_bytes: NonNeg
    fits: bool
    placements: tuple[Placement, ...] = Field(description="ranked: fewest hosts, then most headroom")
    placement_count: NonNeg = Field(description="distinct placements found (at least len(placements))")
    hosts: tuple[HostRoom, ...]
    reason: str | None = Field(None, description="when nothing fits: why, in words")
    calibrations: tuple[str, ...] = Field(
        (), description="the saved calibrations applied (gpumem calibrate) by name, each on its GPU model"
    )
