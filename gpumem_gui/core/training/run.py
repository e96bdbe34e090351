"""What a training run is: :class:`TrainingRun`, every field declared once with its range and its UI.

The CLI flags (``gpumem estimate --mode train``), the window's Training form, the copied command line and
the README's flag table are generated from these declarations (:mod:`gpumem_gui.core.fields`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from gpumem_gui.core.allocator.config import AllocatorModel, AllocConf
from gpumem_gui.core.errors import describe_validation_error
from gpumem_gui.core.fields import ATTN_CHOICES, UI, CudaContextMiB, GpuArchField, NcclChannels
from gpumem_gui.core.spec.model import Frozen
from gpumem_gui.core.training.precision import MEGATRON_OPTIMIZERS
from gpumem_gui.core.training.profile_table import PROFILES
from gpumem_gui.core.training.run_adapters import (
    LoraAlpha,
    LoraDropout,
    LoraRank,
    LoraTargets,
    LoraVisionTower,
    QloraBase,
    QloraExperts,
    parse_lora_targets,
)
from gpumem_gui.core.training.run_fsdp import FsdpUnits, FsdpVersion, ReshardSize
from gpumem_gui.core.training.run_options import (
    OPTIMIZER_CHOICES,
    ActivationOffload,
    AllgatherBucket,
    BucketCapMb,
    BucketView,
    CkptEvery,
    CkptPolicy,
    Compile,
    CompileLoss,
    Float8,
    FrameworkField,
    GradSync,
    LossChunks,
    LossField,
    MaxLiveParams,
    OffloadDevice,
    OptimizerInBackward,
    PersistenceThreshold,
    PpSchedule,
    PpVirtual,
    PrefetchBucket,
    ReduceBucket,
    SequenceParallel,
    TrainImages,
    TrainImageSize,
    TrainVisionTower,
    ZeroImpl,
    sharding_shown,
)

Method = Literal["full", "lora", "qlora"]
Precision = Literal["amp-bf16", "amp-fp16", "mp-bf16", "bf16", "fp32", "megatron-bf16"]
Optimizer = Literal[
    "adamw", "adamw-fused", "adamw-foreach", "adamw-for-loop", "adamw-8bit", "paged-adamw-8bit", "adafactor",
    "sgd", "sgd-momentum", "lion", "paged-adamw-32bit",
]  # fmt: skip

_M, _S, _G = "Method", "Step", "GPUs and sharding"


class TrainingRun(Frozen):
    """Everything about a training / fine-tuning run that changes its memory (validated; see each field's
    help). Field order matters: a validator sees the fields declared before its own."""

    method: Annotated[
        Method,
        UI(
            "Method",
            _M,
            "full: every weight trains (gradients and optimizer states for all of them); lora: frozen base + "
            "small adapters; qlora: LoRA on a bitsandbytes-quantized base (4-bit, or 8-bit with qlora_base "
            "int8)",
            choices=(
                ("full fine-tune", "full"),
                ("LoRA adapters", "lora"),
                ("QLoRA (4-bit base + LoRA)", "qlora"),
            ),
        ),
    ] = "full"
    precision: Annotated[
        Precision,
        UI(
            "Precision",
            _M,
            "how weights, activations, gradients and optimizer states are stored: amp-bf16/amp-fp16 fp32 "
            "weights, gradients and states under autocast (LoRA: a 16-bit frozen base); bf16/fp32 everything "
            "in that dtype (LoRA adapters stay fp32); mp-bf16 FSDP MixedPrecisionPolicy(param_dtype=bf16, "
            "reduce_dtype=fp32): fp32 sharded weights and states, bf16 gathered weights; megatron-bf16 "
            "bf16 weights with fp32 main grads, master weights and states",
            choices=(
                ("mixed bf16 (fp32 master, bf16 autocast)", "amp-bf16"),
                ("mixed fp16 (fp32 master, fp16 autocast)", "amp-fp16"),
                ("FSDP mixed bf16 (fp32 shards, bf16 compute)", "mp-bf16"),
                ("pure bf16", "bf16"),
                ("fp32", "fp32"),
                ("Megatron bf16 (fp32 main grads)", "megatron-bf16"),
            ),
        ),
    ] = "amp-bf16"
    optimizer: Annotated[
        Optimizer,
        UI(
            "Optimizer",
            _M,
            "AdamW keeps two fp32 states per trainable parameter (8-bit: one byte each; paged: those of "
            "parameters of 1e5 elements or more in CUDA unified memory, outside the torch allocator); "
            "adamw = torch's CUDA default (foreach); foreach/fused/for-loop differ in their step "
            "temporaries; Adafactor factors the second moment; SGD keeps none (momentum: one)",
            choices=OPTIMIZER_CHOICES,
        ),
    ] = "adamw"
    batch: Annotated[
        int,
        Field(ge=1, le=1 << 20),
        UI("Micro-batch", _S, "sequences per micro-batch on each data-parallel rank", unit=" seq"),
    ] = 1
    seq: Annotated[
        int,
        Field(ge=1, le=1 << 24),
        UI("Sequence", _S, "tokens per training sequence", unit=" tokens", step=256),
    ] = 2048
    grad_accum: Annotated[
        int,
        Field(ge=1, le=1 << 16),
        UI(
            "Grad accumulation",
            _S,
            "micro-batches per optimizer step: gradients live across them; with pipeline parallelism it "
            "bounds the micro-batches in flight",
            unit=" micro-batches",
        ),
    ] = 1
    grad_ckpt: Annotated[
        bool,
        UI(
            "Gradient checkpointing",
            _S,
            "non-reentrant activation checkpointing of every decoder layer: only the layer inputs are kept, "
            "one layer is recomputed at a time during backward",
        ),
    ] = False
    attn: Annotated[
        Literal["sdpa", "eager", "flash"],
        UI(
            "Attention",
            _S,
            "attn_implementation: eager keeps the scores and probabilities for backward; sdpa and flash keep "
            "the output and the log-sum-exp",
            choices=ATTN_CHOICES,
        ),
    ] = "sdpa"
    lora_rank: LoraRank = 16
    lora_alpha: LoraAlpha = 32
    lora_targets: LoraTargets = "all-linear"
    lora_dropout: LoraDropout = 0.0
    lora_vision_tower: LoraVisionTower = "targets"
    dropout: Annotated[
        float | None,
        Field(ge=0, lt=1),
        UI(
            "Model dropout",
            _S,
            "hidden and attention dropout: above 0 each dropout keeps its mask for backward (eager attention "
            "also its dropped probabilities); default: the config's own (resid_pdrop / dropout / "
            "residual_dropout, attention_dropout / attn_pdrop)",
            step=0.01,
            special="from the config",
            none=-0.01,
        ),
    ] = None
    qlora_base: QloraBase = "nf4"
    qlora_experts: QloraExperts = "bf16"
    frozen_layers: Annotated[
        int,
        Field(ge=0, le=4096),
        UI(
            "Frozen layers",
            _M,
            "the first decoder layers kept frozen: no gradients or optimizer states for them",
            unit=" layers",
        ),
    ] = 0
    dp: Annotated[
        int,
        Field(ge=1, le=4096),
        UI("Data parallel", _G, "data-parallel replicas; ZeRO and FSDP shard over them", unit=" ranks"),
    ] = 1
    tp: Annotated[
        int,
        Field(ge=1, le=4096),
        UI("Tensor parallel", _G, "tensor-parallel degree: divides the heads", unit=" GPUs"),
    ] = 1
    pp: Annotated[
        int,
        Field(ge=1, le=4096),
        UI(
            "Pipeline parallel",
            _G,
            "pipeline stages (at most the layers); 1F1B keeps min(pp - stage, micro-batches) micro-batches "
            "in flight on a stage",
            unit=" stages",
        ),
    ] = 1
    ep: Annotated[
        int,
        Field(ge=1, le=4096),
        UI("Expert parallel", _G, "expert-parallel degree (MoE): divides the experts and dp x tp"),
    ] = 1
    cp: Annotated[
        int,
        Field(ge=1, le=4096),
        UI(
            "Context parallel",
            _G,
            "context-parallel degree: each rank holds seq / cp tokens (ring attention)",
        ),
    ] = 1
    zero: Annotated[
        Literal[0, 1, 2, 3],
        UI(
            "ZeRO stage",
            _G,
            "DeepSpeed ZeRO: shard optimizer states (1), gradients too (2), parameters too (3) over the "
            "data-parallel ranks; with dp 1 it shards nothing",
            choices=(("off", 0), ("1: optimizer states", 1), ("2: + gradients", 2), ("3: + parameters", 3)),
        ),
    ] = 0
    offload: Annotated[
        Literal["none", "optimizer", "optimizer+params"],
        UI(
            "CPU offload",
            _G,
            "DeepSpeed offload_optimizer / offload_param: states (and with ZeRO-3 or FSDP, parameters) live "
            "in CPU RAM; the estimate names the RAM they need",
            choices=(
                ("none", "none"),
                ("optimizer states", "optimizer"),
                ("optimizer + parameters", "optimizer+params"),
            ),
            shown=sharding_shown("offload", "none"),
        ),
    ] = "none"
    fsdp: Annotated[
        Literal["none", "full_shard", "shard_grad_op", "hybrid_shard"],
        UI(
            "FSDP",
            _G,
            "PyTorch FSDP sharding strategy (instead of ZeRO): FULL_SHARD gathers one unit at a time, "
            "SHARD_GRAD_OP keeps parameters gathered, HYBRID_SHARD shards within a node",
            choices=(
                ("off", "none"),
                ("FULL_SHARD", "full_shard"),
                ("SHARD_GRAD_OP", "shard_grad_op"),
                ("HYBRID_SHARD", "hybrid_shard"),
            ),
            shown=sharding_shown("fsdp", "none"),
        ),
    ] = "none"
    gpus: Annotated[int | None, Field(ge=1, le=1 << 20)] = Field(
        None, description="total GPUs (a check only): must be dp x tp x pp x cp"
    )
    gpus_per_node: Annotated[
        int,
        Field(ge=1, le=4096),
        UI(
            "GPUs per node",
            _G,
            "HYBRID_SHARD shards within a node of this many GPUs",
            unit=" GPUs",
            shown=lambda v: v.get("fsdp") == "hybrid_shard",
        ),
    ] = 8
    first_step: Annotated[
        bool,
        UI(
            "First step",
            _S,
            "the first optimizer step: states do not exist yet during forward and backward (steady state: "
            "they do)",
        ),
    ] = False
    images: TrainImages = 0
    image_size: TrainImageSize = 1024
    train_vision_tower: TrainVisionTower = False
    cuda_context_mib: CudaContextMiB = None
    gpu_arch: GpuArchField = "auto"
    nccl_channels: NcclChannels
    allocator_model: AllocatorModel = False  # the caching allocator model (core/allocator) and its settings
    alloc_conf: AllocConf = ""
    # the framework and its tricks (training/run_options.py declares them; training/profiles.py applies them)
    framework: FrameworkField = "pytorch"
    loss: LossField = "auto"
    loss_chunks: LossChunks = 8  # torchtune modules/loss/ce_chunked_output_loss.py, num_output_chunks=8
    optimizer_in_backward: OptimizerInBackward = False
    activation_offload: ActivationOffload = False
    ckpt_every: CkptEvery = 1
    ckpt_policy: CkptPolicy = "full"
    float8: Float8 = False
    compile: Compile = False
    compile_loss: CompileLoss = "auto"
    grad_sync: GradSync = "auto"  # sharding details from here on, each default the runtime's own
    fsdp_version: FsdpVersion = 2
    reshard_size: ReshardSize = None
    fsdp_units: FsdpUnits = "auto"
    bucket_cap_mb: BucketCapMb = 25.0  # torch/nn/parallel/distributed.py, DDP(bucket_cap_mb)
    bucket_view: BucketView = False  # DistributedDataParallel(gradient_as_bucket_view=False)
    zero_impl: ZeroImpl = "deepspeed"
    reduce_bucket: ReduceBucket = 500_000_000  # and the 4 below: deepspeed/runtime/zero/config.py defaults
    allgather_bucket: AllgatherBucket = 500_000_000
    prefetch_bucket: PrefetchBucket = 50_000_000
    max_live_params: MaxLiveParams = 1_000_000_000
    persistence_threshold: PersistenceThreshold = 100_000
    offload_device: OffloadDevice = "cpu"
    sequence_parallel: SequenceParallel = False
    pp_schedule: PpSchedule = "1f1b"
    pp_virtual: PpVirtual = 1

    @model_validator(mode="before")
    @classmethod
    def _framework_precision(cls, data: Any) -> Any:
        """A framework's own precision (``Profile.precision``) when the run names none; one given stays."""
        if isinstance(data, dict) and "precision" not in data:
            p = PROFILES.get(data.get("framework", "pytorch"))  # type: ignore[call-overload]
            if p is not None and p.precision is not None:
                return {**data, "precision": p.precision}
        return data

    @field_validator("optimizer")
    @classmethod
    def _optimizer_for_precision(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("precision") == "megatron-bf16" and v not in MEGATRON_OPTIMIZERS:
            raise ValueError(
                f"optimizer {v!r} is not available with precision 'megatron-bf16' "
                f"(use one of {', '.join(MEGATRON_OPTIMIZERS)})"
            )
        return v

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _targets(cls, v: object) -> object:
        return parse_lora_targets(v)

    @field_validator("fsdp")
    @classmethod
    def _fsdp(cls, v: str, info: ValidationInfo) -> str:
        if v != "none" and info.data.get("zero", 0):
            raise ValueError("choose either DeepSpeed ZeRO (zero) or FSDP (fsdp), not both")
        return v

    @field_validator("offload")
    @classmethod
    def _offload(cls, v: str, info: ValidationInfo) -> str:
        zero = info.data.get("zero", 0)
        if v == "optimizer" and not zero:
            raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3 (DeepSpeed offload_optimizer)")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | None, info: ValidationInfo) -> int | None:
        d = info.data
        need = d.get("dp", 1) * d.get("tp", 1) * d.get("pp", 1) * d.get("cp", 1)
        if v is not None and v != need:
            raise ValueError(
                f"{v} GPUs do not match dp x tp x pp x cp = {d.get('dp', 1)} x {d.get('tp', 1)} x "
                f"{d.get('pp', 1)} x {d.get('cp', 1)} = {need}"
            )
        return v

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


def make_training_run(**fields: object) -> TrainingRun:
    """Build a :class:`TrainingRun`; a bad value is one :class:`GpumemInputError` naming the field."""
    try:
        return TrainingRun(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise describe_validation_error(e, source="run") from None
