"""The training estimate: ``estimate_training(spec, run) -> Estimate``, one replayed step per pipeline stage.

See :mod:`gpumem_gui.core.training` for the phases and what several GPUs change.
"""

from __future__ import annotations

from dataclasses import replace

from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.optim import resolve
from gpumem_gui.core.replay.step import PHASES, StepResult
from gpumem_gui.core.results.estimate import Estimate, GpuShare, Phase, tp_ranks
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.results.reserve import allocator_facts
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training.checks import check_training
from gpumem_gui.core.training.comms import rank_nontorch
from gpumem_gui.core.training.explain import RunExplained, components, extra_component
from gpumem_gui.core.training.model_parallel import (
    Extra,
    cp_buffers,
    ep_buffers,
    in_flight,
    tp_embedding_grad,
    zb_weight_inputs,
)
from gpumem_gui.core.training.offload import offload_bytes, rank_facts, rank_notes
from gpumem_gui.core.training.profiles import profile_facts
from gpumem_gui.core.training.rank import simulate
from gpumem_gui.core.training.ranks import stage_rank_classes
from gpumem_gui.core.training.run import TrainingRun


def _stage_extras(
    spec: ModelSpec, run: TrainingRun, stage: int, res: StepResult, cfg: ReplayConfig, rspec: ModelSpec
) -> tuple[float, list[Extra]]:
    """What a stage holds beside its replayed micro-batch in forward and backward: the activations of the
    other in-flight micro-batches (:func:`in_flight`), zero bubble's held output gradients, the context- and
    expert-parallel exchange buffers of one layer."""
    n, pipe = in_flight(run, stage)
    extras: list[Extra] = []
    extra_act = round((n - 1) * res.microbatch_activations)
    if pipe is not None and extra_act:
        formula = (
            f"(in-flight micro-batches - 1) x activations one micro-batch keeps for backward; {pipe.formula}"
        )
        inputs = {**pipe.inputs, "per_microbatch": res.microbatch_activations}
        extras.append(replace(pipe, bytes=extra_act, formula=formula, inputs=inputs))
    for extra in (
        zb_weight_inputs(run, cfg, rspec),
        cp_buffers(run, cfg, rspec),
        ep_buffers(run, cfg, rspec),
        tp_embedding_grad(run, cfg, spec),
    ):
        if extra is not None and extra.bytes:
            extras.append(extra)
    return n, extras


def _stage_phases(
    spec: ModelSpec, run: TrainingRun, stage: int, dp_rank: int | None = None, rx: RunExplained | None = None
) -> tuple[dict[str, Phase], StepResult, float]:
    """Each phase of pipeline stage ``stage`` explained (``rx``: what the explanations read of the run, when
    the caller has it)."""
    rx = rx or RunExplained(run)
    res, cfg, rspec = simulate(spec, run, stage, dp_rank)
    inflight, extras = _stage_extras(spec, run, stage, res, cfg, rspec)
    phases: dict[str, Phase] = {}
    for name in PHASES:
        pk = res.phases.get(name)
        if pk is None:
            continue
        comps = components(pk.by_tag, rx, res, cfg, rspec, pk.where)
        total = pk.total
        for e in extras:
            if name in e.phases:
                comps.append(extra_component(e.key, e.label, e.bytes, e.formula, e.inputs, e.source))
                total += e.bytes
        # the allocator model's reserved peak of the phase, the extras (not in the replayed step) on top
        rep = res.allocator.phase(name) if res.allocator is not None else None
        reserved = None if rep is None else rep.reserved_peak + total - pk.total
        phases[name] = Phase(
            name=name,
            peak_bytes=total,
            components=tuple(comps),
            note=f"peak at {pk.where}",
            reserved_bytes=reserved,
        )
    return phases, res, inflight


Share = tuple[GpuShare, dict[str, Phase], StepResult]


def _stage_rank(spec: ModelSpec, rx: RunExplained, stage: int, dp_rank: int | None = None) -> Share:
    """One replayed rank of pipeline stage ``stage`` (``dp_rank``: see :func:`simulate`) as its GPU share."""
    run = rx.run
    phases, res, _ = _stage_phases(spec, run, stage, dp_rank, rx)
    peak_phase = max(phases.values(), key=lambda p: p.peak_bytes)
    # long-lived parameter blocks at the peak (sharded and gathered) do not fragment the allocator
    weights = sum(
        c.bytes for c in peak_phase.components if c.key in ("parameters", "gathered_parameters", "buffers")
    )
    replicas = f" (same on each of {run.dp * run.cp} DP x CP replicas)" if run.dp * run.cp > 1 else ""
    nontorch = rank_nontorch(run, stage)
    share = stage_share(stage, run.tp, peak_phase, weights, nontorch, replicas, res.allocator)
    return share, phases, res


def _dp_ranks(spec: ModelSpec, rx: RunExplained, stage: int, first: Share) -> list[Share]:
    """Every data-parallel rank of a stage where they differ (torch ``ZeroRedundancyOptimizer``: whole
    parameters' states per rank), the most-loaded ``first``, each other rank replayed (cached); else
    ``[first]``."""
    if first[2].state_owner is None:
        return [first]
    owner = first[2].state_owner[0]
    return [first] + [_stage_rank(spec, rx, stage, r) for r in range(rx.run.dp) if r != owner]


def estimate_training(spec: ModelSpec, run: TrainingRun) -> Estimate:
    """The training estimate of ``spec`` under ``run`` (see module docstring)."""
    warnings = check_training(spec, run)
    rx = RunExplained(run)  # what the explanations read of the run alone, once
    shares = [_stage_rank(spec, rx, stage) for stage in range(run.pp)]
    worst, worst_phases, worst_res = max(shares, key=lambda s: s[0].total_bytes)
    peak_phase = max(worst_phases.values(), key=lambda p: p.peak_bytes)
    per_gpu = tp_ranks((s for s, _, _ in shares), run.tp)
    counts = count_params(spec)
    cpu = _cpu_bytes(spec, run, [s[2] for s in shares])
    facts: dict[str, int | float | str | bool | None] = {
        "params_total": counts.total,
        "trainable_params": sum(s[2].trainable_params for s in shares) * run.tp,
        "gpus": run.world,
        "dp": run.dp,
        "tp": run.tp,
        "pp": run.pp,
        "ep": run.ep,
        "cp": run.cp,
        "micro_batches": run.grad_accum,
        "tokens_per_step": run.batch * run.seq * run.grad_accum * run.dp,
        "optimizer": resolve(run.optimizer),
        "precision": run.precision,
        "method": run.method,
        **({"task": spec.encoder.head} if spec.encoder is not None else {}),  # an encoder's task head
        "cpu_bytes": cpu,
        "gradient_bytes": worst_res.grad_bytes,
        "optimizer_state_bytes": worst_res.state_bytes,
        "activation_bytes_per_microbatch": worst_res.microbatch_activations,
        **rank_facts(run, worst_res, [s[2] for s in shares]),
        **allocator_facts(worst_res.allocator),  # the caching allocator model (core/allocator), when on
        # the framework, the defaults its profile applied (with sources), offloaded activations' CPU RAM
        **profile_facts(run, sum(s[2].host_bytes for s in shares)),
    }
    return Estimate(
        mode="train",
        engine="transformers",
        phases=worst_phases,
        peak_phase=peak_phase.name,
        peak_bytes=worst.peak_bytes,
        total_bytes=worst.total_bytes,
        components=worst.components,
        per_gpu=per_gpu,
        kv_cache_bytes=0,
        warnings=[*warnings, *rank_notes(worst_res)],
        facts=facts,
        ranks=stage_rank_classes(run, [_dp_ranks(spec, rx, i, s) for i, s in enumerate(shares)]),
    )


def _cpu_bytes(spec: ModelSpec, run: TrainingRun, results: list[StepResult]) -> int:
    """Host RAM one rank needs for offloaded state (optimizer states, fp32 master copy and gradients the CPU
    Adam reads, parameters); NVMe apart (:func:`gpumem_gui.core.training.offload.offload_bytes`)."""
    return sum(offload_bytes(run, res)[0] + res.host_bytes for res in results)  # + offloaded activations
