"""The result of every estimate: components with explanations, phases with peaks, GPUs with totals.

Every number carries its explanation: the formula in words and symbols, the inputs with their values, and
the source of any constant. The GUI's explanation view and the CLI's ``--json`` both read these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from gpumem_gui.core.spec.model import Frozen

NonNeg = Annotated[int, Field(ge=0)]
InputValue = int | float | str | bool | None


class Explanation(Frozen):
    """How one number was computed."""

    formula: str = Field(description="the formula in words and symbols")
    inputs: dict[str, InputValue] = Field(default_factory=dict)
    source: str = Field("", description="where any non-definitional constant comes from")


class Component(Frozen):
    """One named slice of memory (weights, kv_cache, activations, ...)."""

    key: str = Field(min_length=1)
    label: str
    bytes: NonNeg
    explain: Explanation


class Phase(Frozen):
    """Memory during one phase of the run; ``peak_bytes`` is the largest live total inside it."""

    name: str
    peak_bytes: NonNeg
    components: tuple[Component, ...]
    note: str = ""
    reserved_bytes: NonNeg | None = Field(
        None,
        description="the caching allocator's reserved peak in this phase (torch.cuda.max_memory_reserved "
        "over it, on a GPU with room), where the allocator model ran; None: not modelled",
    )

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)

    @model_serializer(mode="wrap")
    def _reserved_where_modelled(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A phase the allocator model did not run on serializes as it did before phases had it."""
        data: dict[str, object] = handler(self)
        if self.reserved_bytes is None:
            data.pop("reserved_bytes", None)
        return data


class GpuShare(Frozen):
    """What one GPU (rank) holds when the run is split."""

    index: NonNeg
    role: str = Field(description="e.g. 'TP rank 0, PP stage 0'")
    peak_bytes: NonNeg
    total_bytes: NonNeg
    components: tuple[Component, ...]


class RankClass(Frozen):
    """A class of ranks of a training run that hold the same memory: where they sit in the parallel layout
    (pipeline stage, tensor-, context- and expert-parallel positions, data-parallel ranks), how many GPUs
    that is, and what one of them holds at its own peak. Host RAM and NVMe are what one rank of the class
    needs there for offloaded states and parameters."""

    key: str = Field(min_length=1, description="stable id, e.g. 'pp1' or 'pp0-dp3'")
    role: str = Field(description="the position in words, e.g. 'PP stage 1 of 2, TP ranks 0-1'")
    stage: NonNeg = Field(description="pipeline stage")
    tp_ranks: Annotated[int, Field(ge=1)] = Field(description="tensor-parallel positions (all hold the same)")
    cp_ranks: Annotated[int, Field(ge=1)] = Field(description="context-parallel positions (all the same)")
    ep_groups: Annotated[int, Field(ge=1)] = Field(description="expert-parallel groups (each E / ep experts)")
    dp_ranks: tuple[NonNeg, ...] = Field(description="the data-parallel ranks of this class")
    gpus: Annotated[int, Field(ge=1)] = Field(description="GPUs of this class in the whole run")
    first_gpu: NonNeg = Field(description="index of its first GPU in the estimate's per_gpu list")
    peak_bytes: NonNeg
    total_bytes: NonNeg = Field(description="peak + CUDA context, workspaces and allocator reserve")
    peak_phase: str
    components: tuple[Component, ...] = Field(description="at its peak, overheads included")
    host_bytes: NonNeg = Field(0, description="CPU RAM one rank needs for offloaded states / parameters")
    nvme_bytes: NonNeg = Field(0, description="NVMe one rank needs (DeepSpeed ZeRO-Infinity offload)")
    unified_bytes: NonNeg = Field(
        0, description="optimizer states in CUDA unified memory (bitsandbytes paged), outside the peak"
    )
    decides: bool = Field(False, description="the most-loaded class: the one that decides the fit")

    def top_components(self, n: int = 3) -> list[Component]:
        """The ``n`` largest components, largest first (what the CLI and the window list per class)."""
        return sorted(self.components, key=lambda c: -c.bytes)[:n]


class Estimate(Frozen):
    """A complete estimate for one model and one run."""

    mode: str
    engine: str
    phases: dict[str, Phase]
    peak_phase: str
    peak_bytes: NonNeg = Field(description="live tensor bytes at the peak on the most-loaded GPU")
    total_bytes: NonNeg = Field(description="peak + CUDA context, workspaces and allocator reserve")
    components: tuple[Component, ...] = Field(description="at the peak, overheads included")
    per_gpu: tuple[GpuShare, ...]
    kv_cache_bytes: NonNeg
    warnings: tuple[str, ...] = ()
    facts: dict[str, InputValue] = Field(
        default_factory=dict, description="engine facts, e.g. vLLM KV tokens"
    )
    ranks: tuple[RankClass, ...] = Field((), description="training: every class of ranks (empty: inference)")

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)

    @model_serializer(mode="wrap")
    def _ranks_for_training_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """An inference estimate (no rank table) serializes as it did before training estimates had one."""
        data: dict[str, object] = handler(self)
        if not self.ranks:
            data.pop("ranks", None)
        return data

    def off_gpu_columns(self) -> list[tuple[str, str]]:
        """(field, label) of the off-GPU memory some rank class needs (host RAM, NVMe, paged optimizer
        states): the columns the CLI and the window add to the per-rank table."""
        cols = (("host_bytes", "host RAM"), ("nvme_bytes", "NVMe"), ("unified_bytes", "paged states"))
        return [(f, label) for f, label in cols if any(getattr(r, f) for r in self.ranks)]

    def deciding_rank(self) -> RankClass | None:
        """The rank class that decides the fit (the most-loaded); None for an inference estimate."""
        return next((r for r in self.ranks if r.decides), None)


def tp_ranks(stage_shares: Iterable[GpuShare], tp: int) -> tuple[GpuShare, ...]:
    """Every GPU of a plan from one share per pipeline stage (TP rank 0): tensor-parallel ranks of a stage
    hold the same amount, so each stage's share is repeated ``tp`` times with its GPU index and role (rank 0
    is the share itself)."""
    return tuple(
        s
        if r == 0
        else GpuShare(
            index=s.index + r,
            role=s.role.replace("rank 0", f"rank {r}"),
            peak_bytes=s.peak_bytes,
            total_bytes=s.total_bytes,
            components=s.components,
        )
        for s in stage_shares
        for r in range(tp)
    )
