"""The distributed and framework levers of a training run that does not fit: single changes to how the run
is sharded, scheduled or computed, offered where they apply to the run.

Each lever is only a candidate: :func:`gpumem_gui.core.fit.training.fit_training` re-estimates the run with
the change, and lists it only when the core accepts the changed run and it needs less memory than the run as
it is (a lever whose semantics do not lower this run's peak is no answer). The rank is how little the change
gives up, lowest first: free (sequence parallelism, a chunked loss, FSDP mixed precision, the 1F1B
schedule), then a slower step (offloading, resharding, recomputation), then more GPUs.
"""

from __future__ import annotations

from gpumem_gui.core.training import TrainingRun, holds_unsynced_gradients

# (rank, kind, description, update)
Lever = tuple[float, str, str, dict[str, object]]

ADAMW_FAMILY = ("adamw", "adamw-fused", "adamw-foreach", "adamw-for-loop")


def sharding_levers(run: TrainingRun) -> list[Lever]:
    """FSDP mixed precision and resharding, sequence and context parallelism, the pipeline schedule."""
    out: list[Lever] = []
    if run.fsdp != "none" and run.precision in ("amp-bf16", "fp32"):
        out.append(
            (
                1.2,
                "precision",
                "FSDP mixed precision mp-bf16 (fp32 shards, bf16 gathered weights and compute)",
                {"precision": "mp-bf16"},
            )
        )
    if run.fsdp == "shard_grad_op":
        out.append(
            (
                5.5,
                "reshard",
                "FSDP full_shard: reshard parameters after forward (gathered again for backward)",
                {"fsdp": "full_shard"},
            )
        )
    elif run.fsdp == "full_shard" and run.reshard_size is not None:
        out.append((5.5, "reshard", "reshard fully after forward (not to a node)", {"reshard_size": None}))
    if run.tp > 1 and not run.sequence_parallel:
        out.append(
            (
                1.1,
                "sequence_parallel",
                f"sequence parallelism over the {run.tp} TP ranks (norms, dropout, residuals and the loss "
                "sharded)",
                {"sequence_parallel": True},
            )
        )
    if run.pp > 1 and run.pp_schedule in ("gpipe", "interleaved-1f1b"):
        out.append(
            (
                1.3,
                "pp_schedule",
                f"1F1B pipeline schedule instead of {run.pp_schedule} (fewer micro-batches in flight)",
                {"pp_schedule": "1f1b", "pp_virtual": 1},
            )
        )
    if holds_unsynced_gradients(run):
        out.append(
            (
                2.5,
                "grad_sync",
                "reduce the gradients on every micro-batch (accelerate sync_each_batch=True): only their "
                "shards kept between micro-batches",
                {"grad_sync": "each"},
            )
        )
    cp = 2 * run.cp
    if run.seq % cp == 0:
        gpus = run.dp * run.tp * run.pp * cp
        out.append(
            (
                7.5,
                "cp",
                f"context parallel {cp} ({gpus} GPUs: seq / {cp} tokens per rank)",
                {"cp": cp, "gpus": None},
            )
        )
    return out


def trick_levers(run: TrainingRun) -> list[Lever]:
    """The paged optimizer and the frameworks' memory tricks: chunked or fused loss, activation offload,
    optimizer in backward, checkpointing every N-th layer or every layer."""
    out: list[Lever] = []
    if run.optimizer in (*ADAMW_FAMILY, "adamw-8bit"):
        out.append(
            (
                2.1,
                "optimizer",
                "paged 8-bit AdamW (bitsandbytes: states in unified memory, outside the torch allocator)",
                {"optimizer": "paged-adamw-8bit"},
            )
        )
    if run.loss in ("auto", "standard"):
        out.append(
            (
                1.4,
                "loss",
                f"chunked cross-entropy ({run.loss_chunks} chunks, torchtune CEWithChunkedOutputLoss)",
                {"loss": "chunked"},
            )
        )
    if run.loss != "fused-linear":
        out.append(
            (
                1.5,
                "loss",
                "fused linear cross-entropy (Liger / Cut Cross-Entropy: no full logits)",
                {"loss": "fused-linear"},
            )
        )
    if not run.activation_offload:
        out.append(
            (
                4.5,
                "activation_offload",
                "offload saved activations to CPU RAM (torchtune enable_activation_offloading)",
                {"activation_offload": True},
            )
        )
    if not run.optimizer_in_backward:
        out.append(
            (
                3.5,
                "optimizer_in_backward",
                "optimizer step in backward (torchtune optimizer_in_bwd: each gradient freed when used)",
                {"optimizer_in_backward": True},
            )
        )
    out += _checkpoint_levers(run)
    return out


def _checkpoint_levers(run: TrainingRun) -> list[Lever]:
    if not run.grad_ckpt:
        return [
            (
                1.6,
                "grad_ckpt",
                "checkpoint every 2nd decoder layer (torchtitan selective layer AC)",
                {"grad_ckpt": True, "ckpt_every": 2},
            )
        ]
    out: list[Lever] = []
    if run.ckpt_every > 1:
        out.append((1.6, "grad_ckpt", "checkpoint every decoder layer", {"ckpt_every": 1}))
    if run.ckpt_policy != "full":
        desc = "full checkpointing (keep only each layer's input)"
        out.append((1.7, "grad_ckpt", desc, {"ckpt_policy": "full"}))
    return out


def levers(run: TrainingRun) -> list[Lever]:
    """Every distributed and framework lever that applies to ``run`` (candidates, not yet estimated)."""
    return sharding_levers(run) + trick_levers(run)
