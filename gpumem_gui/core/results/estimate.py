"""The result of every estimate: components with explanations, phases with peaks, GPUs with totals.

Every number carries its explanation: the formula in words and symbols, the inputs with their values, and
the source of any constant. The GUI's explanation view and the CLI's ``--json`` both read these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import Field

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

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)


class GpuShare(Frozen):
    """What one GPU (rank) holds when the run is split."""

    index: NonNeg
    role: str = Field(description="e.g. 'TP rank 0, PP stage 0'")
    peak_bytes: NonNeg
    total_bytes: NonNeg
    components: tuple[Component, ...]


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

    def component(self, key: str) -> Component | None:
        return next((c for c in self.components if c.key == key), None)


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
