"""Will a training run fit, and what would make it fit.

The same verdicts as inference (:func:`gpumem_gui.core.fit.verdicts`) on the most-loaded rank, the largest
micro-batch and the longest sequence that fit (memory never falls as either grows, so a galloping search
from the current value, then bisection), the fewest GPUs for the run's sharding, and a ranked list of single
changes: gradient checkpointing, an 8-bit optimizer, LoRA instead of full fine-tuning, QLoRA, a higher ZeRO
stage, optimizer offload, more GPUs, a shorter sequence, a smaller micro-batch with more accumulation; and
the distributed and framework levers of :mod:`gpumem_gui.core.fit.levers` (FSDP mixed precision and
resharding, sequence and context parallelism, the pipeline schedule, a paged optimizer, a chunked or fused
loss, activation offload, optimizer in backward, checkpointing every N-th layer) for a run that does not
fit, each listed only where it lowers the memory of the most-loaded rank.
"""

from __future__ import annotations

from contextlib import nullcontext
from math import ceil

from gpumem_gui.core.cancel import checkpoint
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import (
    DEFAULT_MARGIN_BYTES,
    Change,
    FitReport,
    GpuTarget,
    field_max,
    verdicts,
    window_bound,
)
from gpumem_gui.core.fit.levers import ADAMW_FAMILY, levers
from gpumem_gui.core.monotone import gallop
from gpumem_gui.core.replay.step_tape import many_points
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun, estimate_training, make_training_run

# A lever that does not make the run fit is listed only if it saves at least this share of the most-loaded
# rank's memory (a definition: context parallelism on a run whose peak is the optimizer step saves a few
# kilobytes of activations, which is no answer to "what makes it fit").
MIN_SAVING = 0.01


def _fits(spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int) -> bool:
    """Whether ``run`` fits (:func:`_check`'s verdict). With the allocator model on, a run whose GPUs miss
    already without any allocator reserve is answered from the step's tape alone: the model's reserve is
    never negative (results/reserve.py allocator_component: needed - live, needed >= allocated >= live)
    and nothing else of the estimate depends on it, so the verdict is the same and the caching
    allocator's run (core/allocator, ~0.1 s a point for an 8B model) is saved on the searches' misses."""
    checkpoint()  # every search step and candidate change passes here or through _check
    lower_bound = run.allocator_model and target.calibration is None  # a calibration may scale the total
    if lower_bound and _misses_without_reserve(spec, run, target, margin):
        return False
    return _check(spec, run, target, margin)[0]


def _misses_without_reserve(spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int) -> bool:
    try:
        est = estimate_training(spec, make_training_run(**{**run.model_dump(), "allocator_model": False}))
    except GpumemInputError:
        return False  # _check says why not
    big = target.model_copy(update={"count": max(target.count, len(est.per_gpu))})  # as _check
    for share in est.per_gpu:
        reserve = sum(c.bytes for c in share.components if c.key == "allocator_reserve")
        if big.available(share.index) - margin - (share.total_bytes - reserve) < 0:
            return True
    return False


def _check(spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int) -> tuple[bool, Estimate | None]:
    """(fits, estimate); a run the model or the rules reject does not fit."""
    checkpoint()
    try:
        run = make_training_run(**run.model_dump())
        est = target.calibrated(estimate_training(spec, run))
        big = target.model_copy(update={"count": max(target.count, len(est.per_gpu))})
        return all(v.fits for v in verdicts(est, big, margin)), est
    except GpumemInputError:
        return False, None


def fit_training(
    spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int = DEFAULT_MARGIN_BYTES
) -> FitReport:
    """Verdicts, maxima and ranked changes for a training run (see module docstring)."""
    est = target.calibrated(estimate_training(spec, run))
    if len(est.per_gpu) > target.count:
        raise GpumemInputError(
            f"the run uses {len(est.per_gpu)} GPUs but --gpu gives {target.count}; use NAME:COUNT",
            field="gpu",
        )
    vs = verdicts(est, target, margin)
    fits_now = all(v.fits for v in vs)

    def fits(**upd: object) -> bool:
        return _fits(spec, run.model_copy(update=upd), target, margin)

    # searches stay inside the run fields' declared ranges (a value past them is no answer, not an error)
    # sequences up to the model's context window (its position embeddings or rope were built for them). The
    # sequence search asks the run's shape at a dozen lengths, and so does the batch search when the run fits
    # (it doubles the micro-batch, then bisects; one that misses halves it a few times): the shape's step
    # tape is recorded at their first new point (replay/step_tape.py many_points), not after two replays
    with many_points() if fits_now else nullcontext():
        max_batch = gallop(
            lambda b: fits(batch=b), run.batch, 1, min(1 << 14, field_max(TrainingRun, "batch"))
        )
    seq_hi = min(spec.max_position_embeddings, field_max(TrainingRun, "seq"))
    with many_points():
        max_seq = gallop(lambda s: fits(seq=s), run.seq, 1, seq_hi)
    fewest = _fewest_gpus(spec, run, target, margin)
    return FitReport(
        target=target,
        margin_bytes=margin,
        estimate=est,
        verdicts=vs,
        fits=fits_now,
        max_batch=max_batch,
        max_context=max_seq,
        context_window=window_bound(spec, max_seq),
        max_concurrency=None,
        fewest_gpus=fewest[0] if fewest else None,
        smallest_weights=None,
        smallest_kv_dtype=None,
        changes=_changes(spec, run, target, margin, max_batch, max_seq, fewest, est, fits_now),
    )


def _sharded(run: TrainingRun) -> bool:
    return run.zero > 0 or run.fsdp != "none"


def _fewest_gpus(
    spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int
) -> tuple[int, dict[str, object]] | None:
    """Fewest GPUs with the run's sharding: data-parallel ranks when states are sharded (ZeRO/FSDP), else
    tensor-parallel degrees 1, 2, 4, 8."""
    big = target.model_copy(update={"count": 4096, "free_bytes": None})
    other = run.tp * run.pp * run.cp
    if _sharded(run):

        def fits_dp(d: int) -> bool:
            return _fits(spec, run.model_copy(update={"dp": d, "gpus": None}), big, margin)

        # memory per rank never rises with dp when states are sharded: the last dp that misses, plus one
        misses = gallop(lambda d: not fits_dp(d), run.dp, 1, 512)
        first = 1 if misses is None else misses + 1
        if first <= 512 and fits_dp(first):
            return first * other, {"dp": first, "gpus": None}
        return None
    for tp in (1, 2, 4, 8):
        if spec.num_attention_heads % tp == 0:
            upd: dict[str, object] = {"tp": tp, "gpus": None}
            if _fits(spec, run.model_copy(update=upd), big, margin):
                return tp * run.pp * run.cp * run.dp, upd
    return None


def _changes(
    spec: ModelSpec,
    run: TrainingRun,
    target: GpuTarget,
    margin: int,
    max_batch: int | None,
    max_seq: int | None,
    fewest: tuple[int, dict[str, object]] | None,
    current: Estimate,
    fits_now: bool,
) -> tuple[Change, ...]:
    cands: list[tuple[float, str, str, dict[str, object]]] = []
    if not run.grad_ckpt:
        cands.append((1, "grad_ckpt", "enable gradient checkpointing", {"grad_ckpt": True}))
    if run.optimizer in ADAMW_FAMILY:
        cands.append((2, "optimizer", "8-bit AdamW (bitsandbytes)", {"optimizer": "adamw-8bit"}))
    if run.method == "full":
        cands.append(
            (
                3,
                "method",
                f"LoRA r{run.lora_rank} on all linear layers instead of a full fine-tune",
                {"method": "lora", "lora_targets": "all-linear"},
            )
        )
    if run.method != "qlora":
        cands.append(
            (
                4,
                "method",
                "QLoRA (nf4 with double quantization) instead",
                {"method": "qlora", "qlora_base": "nf4-dq", "lora_targets": "all-linear"},
            )
        )
        if not run.grad_ckpt:
            # the usual single-GPU recipe (QLoRA paper, arXiv 2305.14314: 4-bit base, paged optimizer,
            # gradient checkpointing)
            recipe = {
                "method": "qlora",
                "qlora_base": "nf4-dq",
                "lora_targets": "all-linear",
                "grad_ckpt": True,
                "optimizer": "paged-adamw-8bit",
            }
            cands.append((4, "recipe", "QLoRA + gradient checkpointing + paged 8-bit AdamW", recipe))
    if run.dp > 1 and run.fsdp == "none" and run.zero < 3:
        cands.append((5, "zero", f"ZeRO stage {run.zero + 1}", {"zero": run.zero + 1}))
    if run.zero >= 2 and run.offload == "none":
        cands.append((6, "offload", "offload optimizer states to the CPU", {"offload": "optimizer"}))
    if fewest is not None and fewest[0] > _world(run):
        n, upd = fewest
        how = ", ".join(f"{k} {v}" for k, v in upd.items() if v is not None)
        cands.append((7, "gpus", f"{n} GPUs ({how})", upd))
    if max_seq is not None and max_seq < run.seq:
        cands.append((8, "seq", f"sequences of {max_seq} tokens", {"seq": max_seq}))
    if max_batch is not None and max_batch < run.batch:
        accum = ceil(run.batch * run.grad_accum / max_batch)
        cands.append(
            (
                9,
                "batch",
                f"micro-batch {max_batch} with {accum} accumulation steps (same global batch)",
                {"batch": max_batch, "grad_accum": accum},
            )
        )
    out = []
    for rank, kind, desc, upd in cands:
        ok, est = _check(spec, run.model_copy(update=upd), target, margin)
        if est is not None:
            change = Change(kind=kind, description=desc, update=upd, total_bytes=est.total_bytes, fits=ok)
            out.append((not ok, rank, change))
    if not fits_now:  # the distributed and framework levers answer "what makes it fit"
        seen = {c.total_bytes for *_, c in out}
        out += _lever_changes(spec, run, target, margin, current.total_bytes, seen)
    out.sort(key=lambda t: (t[0], t[1]))
    return tuple(c for *_, c in out)


def _lever_changes(
    spec: ModelSpec, run: TrainingRun, target: GpuTarget, margin: int, current_bytes: int, seen: set[int]
) -> list[tuple[bool, float, Change]]:
    """The levers of :mod:`gpumem_gui.core.fit.levers` that apply to ``run``, each re-estimated; one the core
    rejects, one that neither makes the run fit nor saves :data:`MIN_SAVING` of the most-loaded rank's
    memory, or one that needs exactly what another change needs (the same effect, e.g. a paged optimizer
    whose states the allocator still counts) is left out."""
    out = []
    for rank, kind, desc, upd in levers(run):
        ok, est = _check(spec, run.model_copy(update=upd), target, margin)
        if est is None or est.total_bytes in seen:
            continue
        if not ok and est.total_bytes > current_bytes * (1 - MIN_SAVING):
            continue
        seen.add(est.total_bytes)
        change = Change(kind=kind, description=desc, update=upd, total_bytes=est.total_bytes, fits=ok)
        out.append((not ok, rank, change))
    return out


def _world(run: TrainingRun) -> int:
    return run.dp * run.tp * run.pp * run.cp
