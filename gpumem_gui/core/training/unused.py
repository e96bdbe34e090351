"""Run fields that only some runs use: a value away from its default in a run that does not use it is named
in one note ending "ignored", never dropped silently. One row per field (or group of fields), as data:
what uses it, and the test of whether this run has it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumem_gui.core.errors import short
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.profiles import CHUNKED_LOSSES, resolve
from gpumem_gui.core.training.run import TrainingRun


@dataclass(frozen=True)
class Unused:
    """``fields`` change the estimate only in runs for which ``used(run)`` holds (``used_by`` says which)."""

    fields: tuple[str, ...]
    used_by: str
    used: Callable[[TrainingRun], bool]


def _ddp_buckets(run: TrainingRun) -> bool:
    # frameworks/ddp.py Ddp.sharding: DistributedDataParallel's reducer exists with more than one replica
    return framework(run).name == "ddp" and run.dp > 1


def _deepspeed(run: TrainingRun) -> bool:
    return framework(run).name == "deepspeed"


UNUSED: tuple[Unused, ...] = (
    Unused(("loss_chunks",), "a chunked loss (loss chunked)", lambda r: resolve(r).loss in CHUNKED_LOSSES),
    Unused(("compile_loss",), "torch.compile (compile)", lambda r: r.compile),
    Unused(("pp_schedule",), "pipeline parallelism (pp > 1)", lambda r: r.pp > 1),
    # replay/vision_train.py: the tower trains on the step's images; a text step gives it no gradient
    Unused(("train_vision_tower",), "a step with images (images > 0)", lambda r: r.images > 0),
    # replay/vision_train.py tower_linears: how far the LoRA targets reach into the vision tower
    Unused(("lora_vision_tower",), "LoRA or QLoRA (method lora, qlora)", lambda r: r.method != "full"),
    Unused(
        ("pp_virtual",),
        "the interleaved 1F1B schedule with pp > 1",
        lambda r: r.pp > 1 and r.pp_schedule == "interleaved-1f1b",
    ),
    Unused(("sequence_parallel",), "tensor parallelism (tp > 1)", lambda r: r.tp > 1),
    Unused(("reshard_size",), "FSDP (fsdp full_shard, fsdp_version 2)", lambda r: r.fsdp != "none"),
    Unused(
        ("fsdp_version",), "FSDP (fsdp full_shard, shard_grad_op, hybrid_shard)", lambda r: r.fsdp != "none"
    ),
    Unused(("gpus_per_node",), "FSDP hybrid_shard", lambda r: r.fsdp == "hybrid_shard"),
    Unused(("zero_impl",), "a ZeRO stage (zero 1, 2 or 3)", lambda r: r.zero > 0),
    Unused(
        ("bucket_cap_mb", "bucket_view"), "DDP's gradient buckets (dp > 1 without ZeRO or FSDP)", _ddp_buckets
    ),
    Unused(("reduce_bucket",), "DeepSpeed ZeRO (zero 1-3, zero_impl deepspeed)", _deepspeed),
    Unused(
        ("allgather_bucket",),
        "DeepSpeed ZeRO stages 1 and 2 (zero_impl deepspeed)",
        lambda r: _deepspeed(r) and r.zero in (1, 2),
    ),
    Unused(
        ("prefetch_bucket", "max_live_params", "persistence_threshold"),
        "DeepSpeed ZeRO-3 (zero 3, zero_impl deepspeed)",
        lambda r: _deepspeed(r) and r.zero == 3,
    ),
    Unused(("offload_device",), "offload (optimizer or optimizer+params)", lambda r: r.offload != "none"),
)


def unused_notes(run: TrainingRun) -> list[str]:
    """One note per field set away from its default in a run that does not use it."""
    notes = []
    for row in UNUSED:
        if row.used(run):
            continue
        for name in row.fields:
            value = getattr(run, name)
            if value != TrainingRun.model_fields[name].default:
                notes.append(f"{name}: {short(value)} applies to {row.used_by} only; ignored")
    return notes
