"""The training run's framework and sharding-detail fields, declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.training.run.TrainingRun`; each default is the framework's own, with its source.

Kept apart from :mod:`.run` so the run model stays one readable list; the semantics live in
:mod:`gpumem_gui.core.training.frameworks` (sharding, buckets) and :mod:`gpumem_gui.core.training.profiles`
(framework profiles and their memory tricks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI, image_fields
from gpumem_gui.core.replay.vision import has_tower

_F, _D = "Framework", "Sharding details"

FrameworkName = Literal[
    "pytorch", "hf-trainer", "trl", "torchtune", "torchtitan", "deepspeed", "megatron", "unsloth", "axolotl",
    "llama-factory",
]  # fmt: skip
FRAMEWORK_CHOICES: tuple[tuple[str, str], ...] = (
    ("plain PyTorch (DDP / FSDP2)", "pytorch"),
    ("Hugging Face Trainer", "hf-trainer"),
    ("TRL (SFTTrainer)", "trl"),
    ("torchtune", "torchtune"),
    ("torchtitan", "torchtitan"),
    ("DeepSpeed", "deepspeed"),
    ("Megatron-LM", "megatron"),
    ("unsloth", "unsloth"),
    ("Axolotl", "axolotl"),
    ("LLaMA-Factory", "llama-factory"),
)


def sharding_shown(name: str, default: object) -> Any:
    """Offload and FSDP are offered once there is something to shard (dp > 1 or a ZeRO stage), or when they
    already hold a non-default value (run.py)."""
    return lambda v: (v.get("dp") or 1) > 1 or bool(v.get("zero")) or v.get(name, default) != default


def _dp_only(v: Mapping[str, Any]) -> bool:
    return (v.get("dp") or 1) > 1 and not v.get("zero") and v.get("fsdp", "none") == "none"


def _zero(v: Mapping[str, Any]) -> bool:
    return bool(v.get("zero"))


def _zero_ds(stages: tuple[int, ...]) -> Any:
    return lambda v: v.get("zero") in stages and v.get("zero_impl", "deepspeed") == "deepspeed"


FrameworkField = Annotated[
    FrameworkName,
    UI(
        "Framework",
        _F,
        "the training framework: its defaults (loss implementation, FSDP version, ...) are applied where a "
        "field says 'framework default' and listed with the estimate; each can be overridden",
        choices=FRAMEWORK_CHOICES,
    ),
]
LossField = Annotated[
    Literal["auto", "standard", "chunked", "chunked-output", "fp32-shift", "fused-linear"],
    UI(
        "Loss",
        _F,
        "how the cross-entropy is computed: standard (full logits, upcast to fp32), chunked (torchtune "
        "LinearCrossEntropyLoss, earlier CEWithChunkedOutputLoss: logits per chunk of tokens), "
        "chunked-output (torchtune v0.3 to v0.5: CEWithChunkedOutputLoss over the model's chunked output, "
        "each chunk upcast alone), fp32-shift (torchtune v0.1 / v0.2: fp32 logits and a shifted fp32 copy), "
        "fused-linear (Liger / unsloth / Cut Cross-Entropy: the head and the loss fused, logits never "
        "materialised for the whole sequence); auto: the framework's default",
        choices=(
            ("framework default", "auto"),
            ("standard (full logits)", "standard"),
            ("chunked cross-entropy", "chunked"),
            ("chunked output (torchtune v0.3-v0.5)", "chunked-output"),
            ("fp32 logits + shift copy (torchtune v0.1/v0.2)", "fp32-shift"),
            ("fused linear cross-entropy", "fused-linear"),
        ),
    ),
]
LossChunks = Annotated[
    int,
    Field(ge=1, le=4096),
    UI(
        "Loss chunks",
        _F,
        "chunks of the sequence the chunked loss computes at a time (torchtune num_output_chunks = 8)",
        shown=lambda v: v.get("loss") == "chunked" or v.get("framework") == "torchtune",
    ),
]
OptimizerInBackward = Annotated[
    bool,
    UI(
        "Optimizer in backward",
        _F,
        "torchtune optimizer_in_bwd: each parameter is stepped and its gradient freed as soon as it is "
        "ready, so gradients of the whole model never coexist (no gradient accumulation)",
    ),
]
ActivationOffload = Annotated[
    bool,
    UI(
        "Activation offload",
        _F,
        "saved activations (with checkpointing: the layer inputs) go to CPU RAM during forward and come back "
        "for backward (torchtune enable_activation_offloading, unsloth's offloaded gradient checkpointing)",
    ),
]
CkptEvery = Annotated[
    int,
    Field(ge=1, le=4096),
    UI(
        "Checkpoint every",
        _F,
        "checkpoint every N-th decoder layer only (torchtitan selective layer AC: "
        "activation_checkpoint.selective_ac_option = N); the others keep their activations",
        unit=" layers",
        shown=lambda v: bool(v.get("grad_ckpt")),
    ),
]
CkptPolicy = Annotated[
    Literal["full", "selective-op"],
    UI(
        "Checkpoint policy",
        _F,
        "full: keep only each checkpointed layer's input; selective-op: also keep the outputs of the "
        "expensive ops (torchtitan selective_ac_option = 'op': matmuls except every second one, attention)",
        choices=(("full (layer input only)", "full"), ("selective by op", "selective-op")),
        shown=lambda v: bool(v.get("grad_ckpt")),
    ),
]
Float8 = Annotated[
    bool,
    UI(
        "Float8 linears",
        _F,
        "torchtitan / torchao float8 training: the decoder's linears cast their input and weight to fp8 "
        "(tensorwise scaling) and save the fp8 input for backward",
    ),
]
Compile = Annotated[
    bool,
    UI(
        "torch.compile",
        _F,
        "torch.compile as the framework applies it: decoder layers compiled (RMSNorm, gated activation "
        "and rotary fused by Inductor; its partitioner recomputes pointwise results in backward instead of "
        "saving them), and the loss too where the framework compiles it (torchtune compile_loss, "
        "torchtitan's compiled cross_entropy_loss, torch.compile(model) with the loss in the forward): "
        "no fp32 logits or log-probabilities, the 16-bit logits and two fp32 values per row kept",
    ),
]
CompileLoss = Annotated[
    Literal["auto", "on", "off"],
    UI(
        "Compiled loss",
        _F,
        "with torch.compile, whether the loss is compiled too: auto: as the framework does it now (torchtune "
        "compile_loss for its chunked losses, torchtitan since 2025-04, torch.compile(model) with the loss "
        "in the model's forward); off: an eager loss, as torchtitan ran it before (2024: 'compiling loss "
        "function causes CUDA errors', train.py) or a recipe that discards compile_loss's result; on: "
        "compiled whatever the framework's default (the standard and the chunked losses have a compiled "
        "form)",
        choices=(("framework default", "auto"), ("compiled", "on"), ("eager", "off")),
        shown=lambda v: bool(v.get("compile")),
    ),
]

GradSync = Annotated[
    Literal["auto", "each", "last"],
    UI(
        "Gradient sync",
        _D,
        "when data-parallel gradients are reduced during gradient accumulation: each micro-batch (a plain "
        "loop calling backward; torchtitan, torchtune; accelerate sync_each_batch=True), or only the last "
        "one (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False), DDP no_sync(): the HF Trainer and "
        "accelerate's default). With FSDP, 'last' keeps every unit's unsharded gradients on each rank "
        "across the micro-batches; DDP's gradients are whole either way (with gradient_as_bucket_view a "
        "second copy beside the buckets until the sync); DeepSpeed ZeRO accumulates its own way; auto: the "
        "framework's default",
        choices=(
            ("framework default", "auto"),
            ("every micro-batch", "each"),
            ("last micro-batch only (no_sync)", "last"),
        ),
        shown=lambda v: (v.get("grad_accum") or 1) > 1 and (v.get("dp") or 1) > 1 and not v.get("zero"),
    ),
]
BucketCapMb = Annotated[
    float,
    Field(gt=0, le=1 << 20),
    UI(
        "DDP bucket",
        _D,
        "DistributedDataParallel bucket_cap_mb: gradients are all-reduced in buckets of this size",
        unit=" MB",
        shown=_dp_only,
    ),
]
BucketView = Annotated[
    bool,
    UI(
        "Gradients as bucket views",
        _D,
        "DDP gradient_as_bucket_view: .grad points into the flat buckets (one copy) instead of a second "
        "copy of every gradient (torch's default: off)",
        shown=_dp_only,
    ),
]
ZeroImpl = Annotated[
    Literal["deepspeed", "torch"],
    UI(
        "ZeRO implementation",
        _D,
        "deepspeed: flat partitions split evenly over the ranks; torch: ZeroRedundancyOptimizer (stage 1 "
        "only) assigns whole parameters to ranks, greedily by size, under DDP",
        choices=(("DeepSpeed", "deepspeed"), ("torch ZeroRedundancyOptimizer", "torch")),
        shown=_zero,
    ),
]
ReduceBucket = Annotated[
    int,
    Field(ge=1, le=(1 << 31) - 1),
    UI(
        "Reduce bucket",
        _D,
        "DeepSpeed zero_optimization.reduce_bucket_size (elements)",
        unit=" elements",
        shown=_zero_ds((1, 2, 3)),
    ),
]
AllgatherBucket = Annotated[
    int,
    Field(ge=1, le=(1 << 31) - 1),
    UI(
        "All-gather bucket",
        _D,
        "DeepSpeed zero_optimization.allgather_bucket_size (elements, stages 1 and 2)",
        unit=" elements",
        shown=_zero_ds((1, 2)),
    ),
]
PrefetchBucket = Annotated[
    int,
    Field(ge=0, le=(1 << 31) - 1),
    UI(
        "Prefetch bucket",
        _D,
        "DeepSpeed stage3_prefetch_bucket_size (elements gathered ahead)",
        unit=" elements",
        shown=_zero_ds((3,)),
    ),
]
MaxLiveParams = Annotated[
    int,
    Field(ge=0, le=(1 << 31) - 1),
    UI(
        "Max live parameters",
        _D,
        "DeepSpeed stage3_max_live_parameters: gathered parameters kept before releasing (elements)",
        unit=" elements",
        shown=_zero_ds((3,)),
    ),
]
PersistenceThreshold = Annotated[
    int,
    Field(ge=0, le=(1 << 31) - 1),
    UI(
        "Persistence threshold",
        _D,
        "DeepSpeed stage3_param_persistence_threshold: parameters smaller than this stay unsharded",
        unit=" elements",
        shown=_zero_ds((3,)),
    ),
]
OffloadDevice = Annotated[
    Literal["cpu", "nvme"],
    UI(
        "Offload to",
        _D,
        "where offloaded states (and parameters) live: CPU RAM or NVMe (DeepSpeed ZeRO-Infinity "
        "offload_optimizer.device / offload_param.device = nvme; pinned CPU buffers remain)",
        choices=(("CPU RAM", "cpu"), ("NVMe", "nvme")),
        shown=lambda v: v.get("offload", "none") != "none" and bool(v.get("zero")),
    ),
]
SequenceParallel = Annotated[
    bool,
    UI(
        "Sequence parallel",
        _D,
        "Megatron / torchtitan sequence parallelism with TP: norms, dropout and residuals hold seq / tp "
        "tokens on each TP rank (and the loss is vocab-parallel)",
        shown=lambda v: (v.get("tp") or 1) > 1,
    ),
]
PpSchedule = Annotated[
    Literal["1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"],
    UI(
        "Pipeline schedule",
        _D,
        "micro-batches in flight on a stage: GPipe all of them, 1F1B min(pp - stage, micro-batches), "
        "interleaved 1F1B more per virtual stage, zero-bubble (ZB-H1) as 1F1B plus held weight gradients",
        choices=(
            ("1F1B", "1f1b"),
            ("GPipe", "gpipe"),
            ("interleaved 1F1B", "interleaved-1f1b"),
            ("zero bubble (ZB-H1)", "zero-bubble"),
        ),
        shown=lambda v: (v.get("pp") or 1) > 1,
    ),
]
PpVirtual = Annotated[
    int,
    Field(ge=1, le=256),
    UI(
        "Virtual stages",
        _D,
        "model chunks per pipeline rank (interleaved 1F1B: Megatron --num-layers-per-virtual-pipeline-stage)",
        shown=lambda v: v.get("pp_schedule") == "interleaved-1f1b",
    ),
]

# the optimizer field's values in display order (training/run.py TrainingRun.optimizer)
OPTIMIZER_CHOICES = (
    ("AdamW (torch default: foreach)", "adamw"),
    ("AdamW fused", "adamw-fused"),
    ("AdamW foreach", "adamw-foreach"),
    ("AdamW for-loop", "adamw-for-loop"),
    ("AdamW 8-bit (bitsandbytes)", "adamw-8bit"),
    ("paged AdamW 8-bit (bitsandbytes)", "paged-adamw-8bit"),
    ("paged AdamW 32-bit (bitsandbytes)", "paged-adamw-32bit"),
    ("Adafactor", "adafactor"),
    ("SGD", "sgd"),
    ("SGD with momentum", "sgd-momentum"),
    ("Lion", "lion"),
)

# images in each training sequence (core/fields.py image_fields, shared with inference), in run.py's "Step"
# group; the tower frozen as LLaMA-Factory leaves it (hparams/finetuning_args.py freeze_vision_tower: True)
# (offered for models whose vision tower is replayed: training/checks.py says the images of any other are
# not counted)
TrainImages, TrainImageSize = image_fields(
    "Step",
    "the tower is frozen (LLaMA-Factory's freeze_vision_tower default): no gradient, no optimizer state, "
    "nothing saved for backward, unless Train vision tower is on",
    has_tower,
)
# the tower unfrozen in a full fine-tune (LLaMA-Factory hparams/finetuning_args.py freeze_vision_tower:
# false; 2U1/Qwen-VL-Series-Finetune --freeze_vision_tower False): replay/vision_train.py
TrainVisionTower = Annotated[
    bool,
    UI(
        "Train vision tower",
        "Step",
        "full fine-tuning with the vision tower and projector unfrozen (LLaMA-Factory freeze_vision_tower: "
        "false): their gradients and optimizer states, and the tower's activations saved for backward on "
        "the step's images; modelled for Gemma 3's SigLIP, Qwen2.5-VL's, Qwen3-VL's, Mistral 3's Pixtral "
        "and Llama 4's towers",
        model=has_tower,
    ),
]
