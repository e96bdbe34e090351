"""Training and fine-tuning memory: ``estimate_training(spec, run) -> Estimate``.

One optimizer step is replayed tensor by tensor (:mod:`gpumem_gui.core.replay.step`): the transformers forward
and loss on symbolic tensors with autograd's saving rules, the backward engine freeing saved tensors as
gradients appear, and the optimizer step with its implementation's temporaries. Phases:

* ``forward``: parameters, optimizer states (steady state: they exist before the step), activations saved for
  backward growing layer by layer, the autocast weight copies, logits and the fp32 loss computation;
* ``backward``: saved activations freed as gradients appear (the peak is usually at its start, when the fp32
  logits gradient joins the saved activations, or at its end, when every gradient exists);
* ``optimizer``: parameters + gradients + states + the step's temporaries.

``peak_bytes`` is the largest live-tensor total on the most-loaded GPU (``torch.cuda.max_memory_allocated``);
``total_bytes`` adds the CUDA context, cuBLAS workspace and allocator reserve (:mod:`overheads`).

Several GPUs: ZeRO-1/2/3 and FSDP shard optimizer states / gradients / parameters over the data-parallel ranks
(gradients reduce-scattered as they appear; ZeRO-3/FULL_SHARD gather one decoder layer at a time, the root
unit of embeddings and head staying gathered); tensor, pipeline and expert parallelism give each rank its
slice of the model (:func:`gpumem_gui.core.spec.parallel.rank_spec`); 1F1B pipelining keeps the
activations of ``min(pp - stage, grad_accum)`` micro-batches on a stage; context parallelism splits the
sequence.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import ceil
from typing import Annotated, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.replay.adapters import LORA_ALL_LINEAR
from gpumem_gui.core.replay.autograd import REGIONS
from gpumem_gui.core.replay.model import ReplayConfig
from gpumem_gui.core.replay.optim import INFO, resolve, state_bytes_of
from gpumem_gui.core.replay.step import PHASES, StepOptions, StepResult, simulate_step
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase, tp_ranks
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, rank_spec, stage_layers
from gpumem_gui.core.spec.params import count_params, text_tensors
from gpumem_gui.core.training.sharding import ShardingHooks

Method = Literal["full", "lora", "qlora"]
Precision = Literal["amp-bf16", "amp-fp16", "bf16", "fp32", "megatron-bf16"]
Optimizer = Literal[
    "adamw",
    "adamw-fused",
    "adamw-foreach",
    "adamw-for-loop",
    "adamw-8bit",
    "paged-adamw-8bit",
    "adafactor",
    "sgd",
    "sgd-momentum",
    "lion",
]
Degree = Annotated[int, Field(ge=1, le=4096)]

# what each precision means for the weights, the autocast dtype and the gradients (see PRECISION_DOC)
_FULL_DTYPES = {
    "amp-bf16": ("f32", "bf16"),
    "amp-fp16": ("f32", "f16"),
    "bf16": ("bf16", None),
    "fp32": ("f32", None),
    "megatron-bf16": ("bf16", None),
}
_ADAPTER_BASE_DTYPES = {
    "amp-bf16": ("bf16", "bf16"),
    "amp-fp16": ("f16", "f16"),
    "bf16": ("bf16", None),
    "fp32": ("f32", None),
}
PRECISION_DOC = {
    "amp-bf16": "fp32 weights, torch.autocast(bfloat16) over forward + loss, fp32 gradients and optimizer "
    "states "
    "(HF Trainer bf16=True on an fp32 model); LoRA/QLoRA: bf16 frozen base, fp32 adapters, autocast",
    "amp-fp16": "as amp-bf16 with float16 autocast (and a GradScaler, whose state is negligible)",
    "bf16": "weights, gradients and optimizer states in bf16, no autocast (LoRA adapters stay fp32, PEFT's "
    "autocast_adapter_dtype default)",
    "fp32": "everything in fp32, no autocast",
    "megatron-bf16": "bf16 weights, fp32 main_grad buffers, fp32 master weights and fp32 Adam states "
    "(Megatron-LM Float16OptimizerWithFloat16Params / DistributedOptimizer)",
}
_MEGATRON_OPTIMIZERS = ("adamw", "adamw-fused", "adamw-foreach", "sgd", "sgd-momentum")


class TrainingRun(Frozen):
    """Everything about a training / fine-tuning run that changes its memory (validated)."""

    method: Method = Field("full", description="full fine-tune, LoRA adapters, or QLoRA (4-bit base + LoRA)")
    precision: Precision = "amp-bf16"
    optimizer: Optimizer = Field("adamw", description="adamw = torch's CUDA default (foreach)")
    batch: Annotated[int, Field(ge=1, le=1 << 20, description="sequences per micro-batch")] = 1
    seq: Annotated[int, Field(ge=1, le=1 << 24, description="tokens per sequence")] = 2048
    grad_accum: Annotated[int, Field(ge=1, le=1 << 16, description="micro-batches per optimizer step")] = 1
    grad_ckpt: bool = Field(
        False, description="non-reentrant activation checkpointing of every decoder layer"
    )
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    lora_rank: Annotated[int, Field(ge=1, le=1 << 16)] = 16
    lora_alpha: Annotated[float, Field(gt=0, le=1 << 20, description="scaling only: no memory effect")] = 32
    lora_targets: Literal["all-linear"] | tuple[str, ...] = "all-linear"
    lora_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    dropout: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None,
        description="the model's hidden/attention dropout; None: the architecture's default (GPT-2: 0.1)",
    )
    qlora_base: str = Field("nf4", description="4-bit base format of QLoRA: nf4 or nf4-dq (double quant)")
    frozen_layers: Annotated[int, Field(ge=0, le=4096, description="first decoder layers kept frozen")] = 0
    zero: Literal[0, 1, 2, 3] = 0
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
    fsdp: Literal["none", "full_shard", "shard_grad_op", "hybrid_shard"] = "none"
    dp: Degree = 1
    tp: Degree = 1
    pp: Degree = 1
    ep: Degree = 1
    cp: Degree = 1
    gpus: (
        Annotated[int, Field(ge=1, le=1 << 20, description="total GPUs; must be dp x tp x pp x cp")] | None
    ) = None
    gpus_per_node: Degree = Field(8, description="HYBRID_SHARD shards within a node of this many GPUs")
    first_step: bool = Field(
        False, description="states are created inside step(): absent in forward/backward"
    )
    cuda_context_mib: Annotated[int, Field(ge=0, le=1 << 16)] = 500

    @field_validator("optimizer")
    @classmethod
    def _optimizer_for_precision(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("precision") == "megatron-bf16" and v not in _MEGATRON_OPTIMIZERS:
            raise ValueError(
                f"optimizer {v!r} is not available with precision 'megatron-bf16' "
                f"(use one of {', '.join(_MEGATRON_OPTIMIZERS)})"
            )
        return v

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _targets(cls, v: object) -> object:
        if isinstance(v, str) and v != "all-linear":
            v = tuple(x.strip() for x in v.split(",") if x.strip())
        if isinstance(v, list | tuple):
            if not v:
                raise ValueError("name at least one module (q_proj, k_proj, ...) or 'all-linear'")
            return tuple(v)
        return v

    @field_validator("qlora_base")
    @classmethod
    def _qlora_base(cls, v: str, info: ValidationInfo) -> str:
        if v not in ("nf4", "nf4-dq"):
            raise ValueError(f"QLoRA needs a 4-bit bitsandbytes base: 'nf4' or 'nf4-dq', got {v!r}")
        return v

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


# ---- cross-checks against the model ---------------------------------------------------------------------


def _targets(run: TrainingRun) -> tuple[str, ...]:
    return LORA_ALL_LINEAR if run.lora_targets == "all-linear" else tuple(run.lora_targets)


def _target_shapes(spec: ModelSpec, run: TrainingRun) -> list[tuple[str, tuple[int, ...]]]:
    names = set(_targets(run))
    out = []
    for t in text_tensors(spec):
        if t.layer is None or len(t.shape) != 2 or not t.name.endswith(".weight"):
            continue
        if t.name.rsplit(".", 2)[-2] in names:
            out.append((t.name, t.shape))
    return out


def check_training(spec: ModelSpec, run: TrainingRun) -> tuple[str, ...]:
    """Cross-checks of ``run`` against ``spec``: errors raise :class:`GpumemInputError`, soft problems come
    back
    as warnings."""
    warnings: list[str] = []
    if spec.num_attention_heads % run.tp:
        raise GpumemInputError(
            f"tensor parallel degree {run.tp} does not divide the {spec.num_attention_heads} attention heads",
            field="tp",
        )
    if run.pp > spec.num_layers:
        raise GpumemInputError(f"pipeline degree {run.pp} exceeds the {spec.num_layers} layers", field="pp")
    if run.ep > 1:
        if spec.moe is None:
            raise GpumemInputError("expert parallelism needs a mixture-of-experts model", field="ep")
        if spec.moe.num_experts % run.ep:
            raise GpumemInputError(
                f"expert parallel degree {run.ep} does not divide the {spec.moe.num_experts} experts",
                field="ep",
            )
        if (run.dp * run.tp) % run.ep:
            raise GpumemInputError(
                f"expert parallel degree {run.ep} must divide dp x tp = {run.dp * run.tp} (expert ranks are "
                "carved out of the data- and tensor-parallel ranks)",
                field="ep",
            )
    if run.frozen_layers > spec.num_layers:
        raise GpumemInputError(
            f"frozen_layers ({run.frozen_layers}) exceeds the {spec.num_layers} layers", field="frozen_layers"
        )
    if run.method != "full":
        if run.precision == "megatron-bf16":
            raise GpumemInputError(
                f"megatron-bf16 is a full fine-tuning regime; use amp-bf16 or bf16 for {run.method}",
                field="precision",
            )
        shapes = _target_shapes(spec, run)
        if not shapes:
            raise GpumemInputError(
                f"no linear layer of this model is named {', '.join(_targets(run))}", field="lora_targets"
            )
        smallest = min(min(s) for _, s in shapes)
        if run.lora_rank > smallest:
            raise GpumemInputError(
                f"LoRA rank {run.lora_rank} is larger than the smallest targeted layer dimension "
                f"({smallest})",
                field="lora_rank",
            )
        if spec.moe is not None:
            warnings.append(
                "lora: fused 3-D expert weights are not nn.Linear; adapters go on attention and "
                "dense/shared MLP linears only"
            )
    if run.attn == "flash" and run.precision == "fp32":
        raise GpumemInputError("flash attention needs fp16 or bf16 activations", field="attn")
    if run.offload == "optimizer+params" and not (
        run.zero == 3 or run.fsdp in ("full_shard", "hybrid_shard")
    ):
        raise GpumemInputError(
            "parameter offload needs ZeRO-3 or FSDP full_shard/hybrid_shard", field="offload"
        )
    if (run.zero or run.fsdp != "none") and run.dp == 1:
        warnings.append("zero/fsdp: with dp=1 there is nothing to shard; per-GPU memory is unchanged")
    if run.cp > 1 and run.seq % run.cp:
        warnings.append(
            f"cp: seq {run.seq} is not a multiple of cp={run.cp}; ranks get {ceil(run.seq / run.cp)}"
        )
    if run.seq > spec.max_position_embeddings:
        warnings.append(
            f"seq: {run.seq} tokens exceed the model's max_position_embeddings "
            f"({spec.max_position_embeddings})"
        )
    if spec.num_layers % run.pp:
        warnings.append(
            f"pp: {run.pp} stages do not divide {spec.num_layers} layers; the first stages get more"
        )
    if run.method == "qlora" and run.grad_ckpt is False:
        warnings.append(
            "qlora: PEFT's prepare_model_for_kbit_training usually turns gradient checkpointing on"
        )
    return tuple(warnings)


# ---- the simulation per rank -----------------------------------------------------------------------------


def _dtypes(run: TrainingRun) -> tuple[str, str | None]:
    if run.method == "full":
        return _FULL_DTYPES[run.precision]
    return _ADAPTER_BASE_DTYPES[run.precision]


def _shards(run: TrainingRun) -> tuple[int, int, int, str]:
    """(optimizer-state shard, gradient shard, parameter shard, gather mode) over the data-parallel ranks."""
    dp = run.dp
    if run.fsdp == "hybrid_shard":
        g = max(1, min(dp, run.gpus_per_node))
        return g, g, g, "unit" if g > 1 else "none"
    if run.fsdp == "full_shard":
        return dp, dp, dp, "unit" if dp > 1 else "none"
    if run.fsdp == "shard_grad_op":
        return dp, dp, dp, "all" if dp > 1 else "none"
    z = run.zero
    return (
        dp if z >= 1 else 1,
        dp if z >= 2 else 1,
        dp if z >= 3 else 1,
        "unit" if z >= 3 and dp > 1 else "none",
    )


def _degrees(run: TrainingRun) -> Degrees:
    return Degrees(tp=run.tp, pp=run.pp, ep=run.ep)


def _quant_bytes(spec: ModelSpec, run: TrainingRun, rspec: ModelSpec) -> int:
    """Bytes of the 4-bit linears (packed weights + absmax/quant state) on this rank
    (formats.weight_bytes)."""
    cdt = 4 if run.precision == "fp32" else 2
    wb = weight_bytes(rspec, run.qlora_base, compute_dtype_bytes=cdt, quantize_experts=False)
    return wb.quantized_bytes


def step_config(spec: ModelSpec, run: TrainingRun, stage: int = 0) -> tuple[ReplayConfig, ModelSpec]:
    """What pipeline stage ``stage`` (one TP rank of it) replays: its forward's config and its slice of the
    model."""
    rspec = rank_spec(spec, _degrees(run), stage)
    layers = stage_layers(spec, run.pp, stage)
    param_dt, autocast = _dtypes(run)
    frozen = max(0, min(run.frozen_layers, layers.stop) - layers.start)
    cfg = ReplayConfig(
        batch=run.batch,
        q=ceil(run.seq / run.cp),
        param_dt=param_dt,
        autocast=autocast,
        attn="sdpa" if run.attn == "flash" else run.attn,
        grad_ckpt=run.grad_ckpt,
        method=run.method,
        lora_rank=run.lora_rank,
        lora_targets=_targets(run),
        lora_dropout=run.lora_dropout,
        adapter_dt="f32",
        quant_bytes=_quant_bytes(spec, run, rspec) if run.method == "qlora" else 0,
        frozen_layers=frozen,
        lm_head=stage == run.pp - 1,
        embedding=stage == 0,
        dropout=run.dropout if run.dropout is not None else spec.traits.default_dropout,
    )
    return cfg, rspec


def step_options(run: TrainingRun) -> StepOptions:
    """The optimizer side of the step: accumulation, first step, state sharding and offload."""
    state_shard, _, _, _ = _shards(run)
    megatron = run.precision == "megatron-bf16"
    return StepOptions(
        grad_accum=run.grad_accum,
        first_step=run.first_step,
        state_shard=state_shard,
        offload_states=run.offload != "none",
        fused_step=megatron,
        master_bytes_per_param=4 if megatron else 0,
    )


def sharding_hooks(run: TrainingRun) -> ShardingHooks:
    """ZeRO / FSDP / Megatron as hooks on the replay (fresh for each replay: they hold its gathered units)."""
    _, grad_shard, param_shard, gather = _shards(run)
    offload_params = run.offload == "optimizer+params"
    return ShardingHooks(
        param_shard=param_shard,
        grad_shard=grad_shard,
        gather="unit" if offload_params and gather == "none" else gather,
        params_offloaded=offload_params,
        grads_dropped=run.offload != "none",
        main_grad=run.precision == "megatron-bf16",
    )


def simulate_rank(
    spec: ModelSpec, run: TrainingRun, stage: int = 0, cpu_dropout: bool = False
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    """Replay one step of pipeline stage ``stage`` (its TP rank 0). ``cpu_dropout``: replay the CPU dropout
    kernel (a noise tensor of the input's dtype), to compare with measurements made on a CPU."""
    cfg, rspec = step_config(spec, run, stage)
    if cpu_dropout:
        cfg = replace(cfg, cpu_dropout=True)
    res = simulate_step(rspec, cfg, run.optimizer, step_options(run), sharding_hooks(run))
    return res, cfg, rspec


def _simulate(spec: ModelSpec, run: TrainingRun, stage: int) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    try:
        hash(spec)
    except TypeError:  # a spec with an unhashable field: simulate without the cache
        return simulate_rank(spec, run, stage)
    return _simulate_cached(spec, run, stage)


@lru_cache(maxsize=256)
def _simulate_cached(
    spec: ModelSpec, run: TrainingRun, stage: int
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    return simulate_rank(spec, run, stage)


# ---- components and explanations --------------------------------------------------------------------------

_TAGS = (
    ("parameters", "parameters", "parameters"),
    ("gathered parameters", "gathered_parameters", "gathered parameters (ZeRO-3/FSDP)"),
    ("buffers", "buffers", "buffers"),
    ("gradients", "gradients", "gradients"),
    ("optimizer states", "optimizer_states", "optimizer states"),
    ("optimizer temporaries", "optimizer_temporaries", "optimizer step temporaries"),
    ("activations", "activations", "activations"),
    ("weight copies", "weight_copies", "autocast weight copies"),
    ("dequantized weights", "dequantized_weights", "dequantized 4-bit weights"),
    ("logits", "logits", "logits / loss"),
    ("temporaries", "temporaries", "backward temporaries"),
    ("input ids", "inputs", "input ids"),
)


def _explain(
    tag: str, run: TrainingRun, res: StepResult, cfg: ReplayConfig, rspec: ModelSpec, where: str
) -> Explanation:
    param_dt, autocast = _dtypes(run)
    opt = INFO[resolve(run.optimizer)]
    base = {"phase_where": where}
    if tag == "parameters":
        return Explanation(
            formula="every parameter tensor of this rank x bytes of its dtype"
            + (" / data-parallel shard" if _shards(run)[2] > 1 else "")
            + (
                "; 4-bit base linears at their packed size + quantization state"
                if run.method == "qlora"
                else ""
            ),
            inputs={
                **base,
                "dtype": param_dt,
                "param_shard": _shards(run)[2],
                "bytes": res.param_bytes,
                "method": run.method,
                "precision": run.precision,
            },
            source="transformers modeling code (parameter shapes, gpumem_gui.core.spec.params); "
            + ("bitsandbytes Linear4bit via formats.weight_bytes; " if run.method == "qlora" else "")
            + PRECISION_DOC[run.precision],
        )
    if tag == "gathered parameters":
        return Explanation(
            formula="full parameters of the gathered FSDP/ZeRO-3 units: the root unit (embeddings, final "
            "norm, "
            "head) for the whole step, one decoder layer in forward, the current and the prefetched one in "
            "backward (capped at the unsharded model)",
            inputs={**base, "fsdp": run.fsdp, "zero": run.zero, "dp": run.dp},
            source="torch/distributed/fsdp (FULL_SHARD, BACKWARD_PRE prefetch); DeepSpeed ZeRO-3 parameter "
            "partitioning",
        )
    if tag == "gradients":
        return Explanation(
            formula=(
                "fp32 main_grad buffer: 4 B x trainable parameters"
                if run.precision == "megatron-bf16"
                else "one gradient like each trainable parameter, created when backward reaches it"
            )
            + (
                " / data-parallel shard (reduce-scattered as they appear)"
                if run.zero >= 2 or run.fsdp != "none"
                else ""
            ),
            inputs={
                **base,
                "trainable_params": res.trainable_params,
                "bytes_after_backward": res.grad_bytes,
                "grad_accum": run.grad_accum,
            },
            source="torch/csrc/autograd/functions/accumulate_grad.h (gradient stolen into .grad, added in "
            "place "
            "when it exists: gradient accumulation)",
        )
    if tag == "optimizer states":
        return Explanation(
            formula=opt.states
            + ("; + fp32 master weights 4 B/param" if run.precision == "megatron-bf16" else "")
            + ("; / data-parallel shard" if run.zero >= 1 or run.fsdp != "none" else ""),
            inputs={
                **base,
                "optimizer": run.optimizer,
                "bytes": res.state_bytes,
                "trainable_params": res.trainable_params,
                "first_step": run.first_step,
            },
            source=opt.source,
        )
    if tag == "optimizer temporaries":
        return Explanation(
            formula=opt.temporaries, inputs={**base, "optimizer": run.optimizer}, source=opt.source
        )
    if tag in ("activations", "weight copies", "logits", "temporaries", "dequantized weights"):
        what = {
            "activations": "tensors autograd saved for backward (and the forward's live intermediates), "
            "replayed "
            "op by op: linear inputs, SiLU/GELU inputs, both mul operands, RMSNorm fp32 input and rsqrt, "
            "SDPA q/k/v/out/log-sum-exp (eager: fp32 and cast probabilities)",
            "weight copies": "bf16/fp16 copies of the fp32 weights made by autocast, cached until "
            "autocast exits "
            "and kept by the matmuls that saved them",
            "logits": "logits (batch x seq x vocab) in the compute dtype, their fp32 upcast for the loss "
            "and the "
            "saved log-softmax",
            "temporaries": "gradients of activations in flight during backward (and their sums, casts, "
            "slice/reshape copies); recomputed activations under checkpointing",
            "dequantized weights": "a bitsandbytes 4-bit weight dequantized to the compute dtype for one "
            "matmul",
        }[tag]
        return Explanation(
            formula=what,
            inputs={
                **base,
                "batch": run.batch,
                "seq_per_rank": cfg.q,
                "layers": rspec.num_layers,
                "hidden": rspec.hidden_size,
                "attn": cfg.attn,
                "grad_ckpt": run.grad_ckpt,
                "autocast": autocast,
                "activation_dtype": autocast or param_dt,
            },
            source="transformers 5.24 modeling code replayed on symbolic tensors "
            "(gpumem_gui.core.replay.model); "
            "saving rules of torch tools/autograd/derivatives.yaml; checked byte for byte against PyTorch "
            "MemTracker (shared/reference/groundtruth.json grid)",
        )
    if tag == "input ids":
        return Explanation(
            formula="batch x seq x 8 B (int64)",
            inputs={**base, "batch": run.batch, "seq": cfg.q},
            source="definition",
        )
    return Explanation(
        formula="rotary inv_freq buffers (fp32)", inputs=base, source="LlamaRotaryEmbedding.__init__"
    )


def _components(
    by_tag: dict[str, int], run: TrainingRun, res: StepResult, cfg: ReplayConfig, rspec: ModelSpec, where: str
) -> list[Component]:
    out = []
    # the forward's regions (hidden states, attention, MLP, norms, rotary, masks, inputs) are its activations
    by_tag = {**by_tag, "activations": sum(by_tag.get(r, 0) for r in REGIONS)}
    for tag, key, label in _TAGS:
        n = by_tag.get(tag, 0)
        if n <= 0:
            continue
        out.append(
            Component(key=key, label=label, bytes=n, explain=_explain(tag, run, res, cfg, rspec, where))
        )
    return out


def _extra_component(key: str, label: str, n: int, formula: str, inputs: dict, source: str) -> Component:
    return Component(
        key=key, label=label, bytes=n, explain=Explanation(formula=formula, inputs=inputs, source=source)
    )


def _stage_phases(spec: ModelSpec, run: TrainingRun, stage: int) -> tuple[dict[str, Phase], StepResult, int]:
    res, cfg, rspec = _simulate(spec, run, stage)
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
        comps = _components(pk.by_tag, run, res, cfg, rspec, pk.where)
        total = pk.total
        if name != "optimizer" and extra_act:
            comps.append(
                _extra_component(
                    "pipeline_inflight",
                    "activations of other in-flight micro-batches",
                    extra_act,
                    "(in-flight micro-batches - 1) x activations one micro-batch keeps for backward; 1F1B "
                    "keeps "
                    "min(pp - stage, micro-batches) in flight on a stage",
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
                _extra_component(
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
    state_shard, _, param_shard, _ = _shards(run)
    total = 0
    for res in results:
        n = res.trainable_params
        param_dt, _ = _dtypes(run)
        states = state_bytes_of(run.optimizer, n, (n,), "f32")
        master = 4 * n if param_dt != "f32" else 0
        grads = 4 * n
        total += ceil((states + master + grads) / state_shard)
        if run.offload == "optimizer+params":
            total += ceil(res.full_param_bytes / param_shard)
    return total
