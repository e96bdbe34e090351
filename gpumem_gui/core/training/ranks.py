"""The per-rank table of a training estimate: every class of ranks that hold the same memory, with its own
peak, peak phase and components, the host RAM and NVMe one of its ranks needs for offload, and the class
that decides the fit.

A rank's memory depends on its pipeline stage (its layers, the embedding on the first, the head and the loss
on the last, the micro-batches in flight under the schedule) and, where a framework assigns whole
parameters to data-parallel ranks (torch ``ZeroRedundancyOptimizer``), on its data-parallel rank. Tensor-,
context- and expert-parallel positions of a stage hold the same: Megatron / torchtitan split every sharded
weight, the sequence and the experts evenly over them (the model's dimensions must divide, which
:mod:`gpumem_gui.core.spec.parallel` checks). So :func:`rank_classes` takes one replayed rank per stage (and
per data-parallel class, when a framework distinguishes them) and names the positions each one stands for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpumem_gui.core.replay.step import StepResult
from gpumem_gui.core.results.estimate import GpuShare, Phase, RankClass
from gpumem_gui.core.training.offload import offload_bytes
from gpumem_gui.core.training.run import TrainingRun


@dataclass(frozen=True)
class RankReplay:
    """One replayed rank: its pipeline ``stage``, its share (peak phase and overheads) and phases, the host
    RAM and NVMe it needs for what it offloads, its optimizer states in CUDA unified memory (outside the torch
    allocator), and the data-parallel ranks it stands for (``None``: all of them hold the same)."""

    stage: int
    share: GpuShare
    phases: Mapping[str, Phase]
    host_bytes: int = 0
    nvme_bytes: int = 0
    unified_bytes: int = 0
    dp_ranks: tuple[int, ...] | None = None


def _span(name: str, n: int) -> str:
    return f"{name} rank 0" if n == 1 else f"{name} ranks 0-{n - 1}"


def _role(run: TrainingRun, r: RankReplay, dp_ranks: tuple[int, ...]) -> str:
    parts = [f"PP stage {r.stage} of {run.pp}"] if run.pp > 1 else []
    if run.tp > 1:
        parts.append(_span("TP", run.tp))
    if run.cp > 1:
        parts.append(_span("CP", run.cp))
    if run.ep > 1:
        parts.append(f"expert groups 0-{run.ep - 1}")
    if run.dp > 1:
        if len(dp_ranks) == run.dp:
            parts.append(_span("DP", run.dp))
        else:
            more = ", ..." if len(dp_ranks) > 4 else ""
            s = "s" if len(dp_ranks) > 1 else ""
            parts.append(f"DP rank{s} {', '.join(map(str, dp_ranks[:4]))}{more} of {run.dp}")
    return ", ".join(parts) or "the only rank"


def rank_classes(run: TrainingRun, replays: Sequence[RankReplay]) -> tuple[RankClass, ...]:
    """One :class:`RankClass` per replayed rank (see the module docstring); the class with the largest
    total (ties: the first) decides the fit."""
    if not replays:
        return ()
    worst = max(range(len(replays)), key=lambda i: replays[i].share.total_bytes)
    out = []
    for i, r in enumerate(replays):
        dp_ranks = r.dp_ranks if r.dp_ranks is not None else tuple(range(run.dp))
        peak = max(r.phases.values(), key=lambda p: p.peak_bytes)
        key = f"pp{r.stage}" + (f"-dp{dp_ranks[0]}" if r.dp_ranks is not None else "")
        out.append(
            RankClass(
                key=key,
                role=_role(run, r, dp_ranks),
                stage=r.stage,
                tp_ranks=run.tp,
                cp_ranks=run.cp,
                ep_groups=run.ep,
                dp_ranks=dp_ranks,
                gpus=run.tp * run.cp * len(dp_ranks),
                first_gpu=r.share.index,
                peak_bytes=r.share.peak_bytes,
                total_bytes=r.share.total_bytes,
                peak_phase=peak.name,
                components=r.share.components,
                host_bytes=r.host_bytes,
                nvme_bytes=r.nvme_bytes,
                unified_bytes=r.unified_bytes,
                decides=i == worst,
            )
        )
    return tuple(out)


def _bytes_key(r: RankReplay) -> tuple[object, ...]:
    """What a replayed rank holds, in bytes only (the explanations name the rank)."""
    return (
        r.share.peak_bytes,
        r.share.total_bytes,
        tuple((c.key, c.bytes) for c in r.share.components),
        tuple((p.name, p.peak_bytes) for p in r.phases.values()),
        r.host_bytes,
        r.nvme_bytes,
        r.unified_bytes,
    )


def _grouped(replays: list[RankReplay]) -> list[RankReplay]:
    """Data-parallel ranks of one stage that hold the same bytes as one replay (the first of them, its
    ``dp_ranks`` all of theirs), in order of first appearance."""
    out: list[tuple[tuple[object, ...], RankReplay]] = []
    for r in replays:
        key = _bytes_key(r)
        j = next((j for j, (k, _) in enumerate(out) if k == key), None)
        if j is None:
            out.append((key, r))
        else:
            first = out[j][1]
            ranks = tuple(sorted((*(first.dp_ranks or ()), *(r.dp_ranks or ()))))
            out[j] = (key, replace(first, dp_ranks=ranks))
    return [r for _, r in out]


def stage_rank_classes(
    run: TrainingRun, stages: Sequence[Sequence[tuple[GpuShare, Mapping[str, Phase], StepResult]]]
) -> tuple[RankClass, ...]:
    """:func:`rank_classes` of the replayed ranks of each pipeline stage (``stages`` in stage order, as
    :func:`~gpumem_gui.core.training.estimate.estimate_training` replays them): one per stage, or, where the
    replay assigns whole parameters' states to data-parallel ranks (torch ``ZeroRedundancyOptimizer``,
    ``StepResult.state_owner``), one per data-parallel rank, the most-loaded first; ranks holding the same
    bytes form one class. Off the GPU, a rank needs the host RAM and NVMe of what the run offloads
    (:func:`~gpumem_gui.core.training.offload.offload_bytes`) and the host RAM of offloaded activations."""
    out = []
    for i, ranks in enumerate(stages):
        replays = []
        for share, phases, res in ranks:
            host, nvme = offload_bytes(run, res)
            owner = None if res.state_owner is None else (res.state_owner[0],)
            replays.append(
                RankReplay(i, share, phases, host + res.host_bytes, nvme, res.outside_allocator_bytes, owner)
            )
        out.extend(_grouped(replays))
    return rank_classes(run, out)
