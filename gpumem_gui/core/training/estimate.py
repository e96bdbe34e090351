"""The training estimate: ``estimate_training(spec, run) -> Estimate``, one replayed step per pipeline stage.

See :mod:`gpumem_gui.core.training` for the phases and what several GPUs change.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.replay.optim import resolve, state_bytes_of
from gpumem_gui.core.replay.step import PHASES, StepResult
from gpumem_gui.core.results.estimate import Estimate, GpuShare, Phase, tp_ranks
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training.checks import check_training
from gpumem_gui.core.training.explain import components, extra_component
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.precision import dtypes
from gpumem_gui.core.training.rank import simulate
from gpumem_gui.core.training.run import TrainingRun


def _stage_phases(spec: ModelSpec, run: TrainingRun, stage: int) -> tuple[dict[str, Phase], StepResult, int]:
    res, cfg, rspec = simulate(spec, run, stage)
    inflight = min(run.pp - stage, run.grad_accum) if run.pp > 1 else 1
    extra_act = (inflight - 1) * res.microbatch_activations
    cp_buf = 0
    if run.cp > 1:
        # ring attention: K and V chunks of one layer being sent and received (2 x 2 x b x s/cp x kv width)
        kvw = rspec.num_kv_heads * rspec.head_dim
        cp_buf = 2 * 2 * run.batch * cfg.q * kvw * (2 if cfg.autocast or cfg.param_dt != "f32" else 4)
    phases: dict[str, Phase] = {}
    for name in PHASES:
        pk = res.phases.get(name)
        if pk is None:
            continue
        comps = components(pk.by_tag, run, res, cfg, rspec, pk.where)
        total = pk.total
        if name != "optimizer" and extra_act:
            comps.append(
                extra_component(
                    "pipeline_inflight",
                    "activations of other in-flight micro-batches",
                    extra_act,
                    "(in-flight micro-batches - 1) x activations one micro-batch keeps for backward; 1F1B "
                    "keeps min(pp - stage, micro-batches) in flight on a stage",
                    {
                        "pp": run.pp,
                        "stage": stage,
                        "in_flight": inflight,
                        "per_microbatch": res.microbatch_activations,
                    },
                    "Narayanan et al. 2021 (PipeDream-Flush / 1F1B schedule); Megatron-LM schedules.py",
                )
            )
            total += extra_act
        if name != "optimizer" and cp_buf:
            comps.append(
                extra_component(
                    "context_parallel",
                    "context-parallel K/V ring buffers",
                    cp_buf,
                    "2 (send, receive) x (K + V) x batch x seq/cp x kv heads x head_dim x dtype",
                    {"cp": run.cp, "seq_per_rank": cfg.q},
                    "ring attention (Liu et al. 2023); Megatron-LM context parallelism",
                )
            )
            total += cp_buf
        phases[name] = Phase(name=name, peak_bytes=total, components=tuple(comps), note=f"peak at {pk.where}")
    return phases, res, inflight


def estimate_training(spec: ModelSpec, run: TrainingRun) -> Estimate:
    """The training estimate of ``spec`` under ``run`` (see module docstring)."""
    warnings = check_training(spec, run)
    shares: list[tuple[GpuShare, dict[str, Phase], StepResult]] = []
    for stage in range(run.pp):
        phases, res, _ = _stage_phases(spec, run, stage)
        peak_phase = max(phases.values(), key=lambda p: p.peak_bytes)
        # long-lived parameter blocks at the peak (sharded and gathered) do not fragment the allocator
        weights = sum(
            c.bytes
            for c in peak_phase.components
            if c.key in ("parameters", "gathered_parameters", "buffers")
        )
        replicas = f" (same on each of {run.dp * run.cp} DP x CP replicas)" if run.dp * run.cp > 1 else ""
        share = stage_share(stage, run.tp, peak_phase, weights, run.cuda_context_mib, replicas)
        shares.append((share, phases, res))
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
        "cpu_bytes": cpu,
        "gradient_bytes": worst_res.grad_bytes,
        "optimizer_state_bytes": worst_res.state_bytes,
        "activation_bytes_per_microbatch": worst_res.microbatch_activations,
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
        warnings=warnings,
        facts=facts,
    )


def _cpu_bytes(spec: ModelSpec, run: TrainingRun, results: list[StepResult]) -> int:
    """CPU RAM one rank needs for offloaded state: optimizer states (+ fp32 master copy and gradients that
    DeepSpeed's CPU Adam reads) and, with parameter offload, the parameters."""
    if run.offload == "none":
        return 0
    sh = framework(run).sharding(run)
    param_dt, _ = dtypes(run)
    total = 0
    for res in results:
        n = res.trainable_params
        states = state_bytes_of(run.optimizer, n, (n,), "f32")
        master = 4 * n if param_dt != "f32" else 0
        grads = 4 * n
        total += ceil((states + master + grads) / sh.state_shard)
        if run.offload == "optimizer+params":
            total += ceil(res.full_param_bytes / sh.param_shard)
    return total
