"""What each training precision means: the dtypes of weights, autocast and adapters, and Megatron's fp32
main-grad buffers and master weights. The replay reads these profiles; it never branches on a precision's
name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumem_gui.core.training.run import TrainingRun


PRECISION_DOC = {
    "amp-bf16": "fp32 weights, torch.autocast(bfloat16) over forward + loss, fp32 gradients and optimizer "
    "states (HF Trainer bf16=True on an fp32 model); LoRA/QLoRA: bf16 frozen base, fp32 adapters, autocast",
    "amp-fp16": "as amp-bf16 with float16 autocast (and a GradScaler, whose state is negligible)",
    "mp-bf16": "FSDP MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (FSDP1: MixedPrecision): fp32 "
    "sharded parameters, sharded gradients and optimizer states; the all-gather casts the shards to bf16, so "
    "the unsharded parameters, activations and unsharded gradients are bf16 and there is no autocast copy; "
    "gradients are reduce-scattered in fp32 (torch/distributed/fsdp/_fully_shard/_fsdp_api.py "
    "MixedPrecisionPolicy, _fsdp_param.py init_dtype_attrs, _fsdp_collectives.py foreach_reduce); FSDP only",
    "bf16": "weights, gradients and optimizer states in bf16, no autocast (LoRA adapters stay fp32, PEFT's "
    "autocast_adapter_dtype default)",
    "fp32": "everything in fp32, no autocast",
    "megatron-bf16": "bf16 weights, fp32 main_grad buffers, fp32 master weights and fp32 Adam states "
    "(Megatron-LM Float16OptimizerWithFloat16Params / DistributedOptimizer)",
}
MEGATRON_OPTIMIZERS = ("adamw", "adamw-fused", "adamw-foreach", "sgd", "sgd-momentum")


@dataclass(frozen=True)
class PrecisionProfile:
    """``full``: (parameter dtype, autocast dtype or None) of a full fine-tune; ``adapters``: the frozen
    base's (None: not allowed with LoRA/QLoRA); ``main_grad``: gradients go into a preallocated fp32 buffer
    (dropped on the GPU as they appear); ``master_bytes``: per trainable parameter, fp32 master weights the
    optimizer keeps; ``fused_step``: the optimizer steps on flat fp32 buffers (no per-tensor temporaries).
    ``store_scale``: FSDP mixed precision: the sharded parameters are stored at this many times the bytes of
    the compute dtype (2: fp32 shards of bf16 compute), and gradients are reduced in ``reduce_bytes``-byte
    floats; such a precision needs FSDP (``fsdp_only``)."""

    full: tuple[str, str | None]
    adapters: tuple[str, str | None] | None
    main_grad: bool = False
    master_bytes: int = 0
    fused_step: bool = False
    store_scale: int = 1
    reduce_bytes: int = 0
    fsdp_only: bool = False

    @property
    def compute_bytes(self) -> int:
        """Bytes of the activation dtype (4 for fp32, else 2)."""
        param, autocast = self.full
        return 4 if (autocast or param) == "f32" else 2


PRECISIONS: dict[str, PrecisionProfile] = {
    "amp-bf16": PrecisionProfile(full=("f32", "bf16"), adapters=("bf16", "bf16")),
    "amp-fp16": PrecisionProfile(full=("f32", "f16"), adapters=("f16", "f16")),
    # torch/distributed/fsdp/_fully_shard/_fsdp_api.py MixedPrecisionPolicy(param_dtype=bf16,
    # reduce_dtype=fp32): the replay runs the bf16 compute copies; the hooks store fp32 shards
    "mp-bf16": PrecisionProfile(
        full=("bf16", None), adapters=("bf16", None), store_scale=2, reduce_bytes=4, fsdp_only=True
    ),
    "bf16": PrecisionProfile(full=("bf16", None), adapters=("bf16", None)),
    "fp32": PrecisionProfile(full=("f32", None), adapters=("f32", None)),
    # Megatron-LM Float16OptimizerWithFloat16Params / DistributedOptimizer (megatron/core/optimizer)
    "megatron-bf16": PrecisionProfile(
        full=("bf16", None), adapters=None, main_grad=True, master_bytes=4, fused_step=True
    ),
}
assert set(PRECISIONS) == set(PRECISION_DOC), "every precision has a profile and a description"


def precision(run: TrainingRun) -> PrecisionProfile:
    return PRECISIONS[run.precision]


def dtypes(run: TrainingRun) -> tuple[str, str | None]:
    """(parameter dtype, autocast dtype) of the run's trained (full) or frozen (LoRA/QLoRA) weights."""
    p = precision(run)
    if run.method == "full" or p.adapters is None:
        return p.full
    return p.adapters
