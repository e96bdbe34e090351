"""The components of a training phase, each with its formula, inputs and source."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import REGIONS
from gpumem_gui.core.replay.optim import INFO, OptimizerInfo, resolve
from gpumem_gui.core.replay.step import StepResult
from gpumem_gui.core.results.estimate import Component, Explanation
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.buckets import BUCKETS_SOURCE, ZERO_TORCH_SOURCE, bucket_explanation, owner_text
from gpumem_gui.core.training.frameworks.deepspeed import (
    FLAT_STEP_SOURCE,
    FLAT_STEP_WHAT,
    GRADS_SOURCE,
    MASTER_SOURCE,
    zero_explanation,
)
from gpumem_gui.core.training.fsdp_explain import FSDP_EXPLAIN, FSDP_TAGS, gathered
from gpumem_gui.core.training.model_parallel import rank_sharding
from gpumem_gui.core.training.precision import PRECISION_DOC, dtypes
from gpumem_gui.core.training.profiles import profile, trick_sources
from gpumem_gui.core.training.run import TrainingRun

# (replay tag, component key, label) in display order
_TAGS = (
    ("parameters", "parameters", "parameters"),
    ("gathered parameters", "gathered_parameters", "gathered parameters (ZeRO-3/FSDP)"),
    *FSDP_TAGS,  # FSDP2 all-gather / reduce-scatter buffers, 1/N post-forward shards, unsharded gradients
    ("buffers", "buffers", "buffers"),
    ("gradients", "gradients", "gradients"),
    ("gradient buckets", "gradient_buckets", "DDP gradient buckets"),
    ("reduce bucket", "reduce_bucket", "ZeRO reduce (IPG) bucket"),
    ("fp32 gradient partition", "fp32_gradient_partition", "ZeRO fp32 gradient partition"),
    ("optimizer states", "optimizer_states", "optimizer states"),
    ("optimizer temporaries", "optimizer_temporaries", "optimizer step temporaries"),
    ("activations", "activations", "activations"),
    ("weight copies", "weight_copies", "autocast weight copies"),
    ("dequantized weights", "dequantized_weights", "dequantized 4-bit weights"),
    ("logits", "logits", "logits / loss"),
    ("temporaries", "temporaries", "backward temporaries"),
    ("sequence-parallel buffer", "sp_gather_buffer", "sequence-parallel all-gather buffer"),
    ("input ids", "inputs", "input ids"),
    ("vision", "vision", "vision tower (images)"),
)

_ACTIVATION_WHAT = {
    "activations": "tensors autograd saved for backward (and the forward's live intermediates), replayed "
    "op by op: linear inputs, SiLU/GELU inputs, both mul operands, RMSNorm fp32 input and rsqrt, SDPA "
    "q/k/v/out/log-sum-exp (eager: fp32 and cast probabilities)",
    "weight copies": "bf16/fp16 copies of the fp32 weights made by autocast, cached until autocast exits and "
    "kept by the matmuls that saved them",
    "logits": "logits (batch x seq x vocab) in the compute dtype, their fp32 upcast for the loss and the "
    "saved log-softmax",
    "temporaries": "gradients of activations in flight during backward (and their sums, casts, slice/reshape "
    "copies); recomputed activations under checkpointing",
    "dequantized weights": "a bitsandbytes 4-bit weight dequantized to the compute dtype for one matmul",
    "sequence-parallel buffer": "Megatron-LM's persistent all-gather buffer (global memory buffer 'mpu'): "
    "batch x seq x hidden of the input of the column-parallel linears, reused by every layer (megatron/core/"
    "tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication)",
}


class RunExplained:
    """What the explanations read of the run alone, worked out once per estimate and shared by every phase
    and stage (each read ~3-14 times an estimate before)."""

    def __init__(self, run: TrainingRun) -> None:
        self.run = run
        self.sharding = rank_sharding(run)  # over the dp x cp ranks

    @cached_property
    def dtypes(self) -> tuple[str, str | None]:
        return dtypes(self.run)

    @cached_property
    def tricks(self) -> str:
        return trick_sources(self.run)  # the framework's loss and memory tricks (training/profiles.py)

    @cached_property
    def optimizer(self) -> OptimizerInfo:
        return INFO[resolve(self.run.optimizer)]


class _Ctx:
    """What every explanation of one phase reads."""

    def __init__(self, rx: RunExplained, res: StepResult, cfg: ReplayConfig, rspec: ModelSpec, where: str):
        self.rx, self.run, self.res, self.cfg, self.rspec = rx, rx.run, res, cfg, rspec
        self.base: dict[str, object] = {"phase_where": where}
        self.sharding = rx.sharding


# the quantized base's formula and source, by whether it is bitsandbytes' 8-bit format
_QUANT_BASE = {
    False: (
        "4-bit base linears at their packed size + quantization state",
        "bitsandbytes Linear4bit via formats.weight_bytes",
    ),
    True: (
        "8-bit base linears (Linear8bitLt): int8 weights + fp32 row scales (SCB); each keeps its input for "
        "backward and dequantizes its whole weight there",
        "bitsandbytes Linear8bitLt / MatMul8bitLt (bitsandbytes/nn/modules.py, autograd/_functions.py) via "
        "formats.weight_bytes",
    ),
}


def _parameters(c: _Ctx) -> Explanation:
    run, qlora = c.run, c.run.method == "qlora"
    int8 = run.qlora_base == "int8"
    prof = profile(run)
    lora_src = prof.lora_model_dtype_source if run.method != "full" and prof.lora_model_dtype else ""
    return Explanation(
        formula="every parameter tensor of this rank x bytes of its dtype"
        + (" / data-parallel shard" if c.sharding.param_shard > 1 else "")
        + (f"; {_QUANT_BASE[int8][0]}" if qlora else "")
        + (f"; LoRA adapters in {c.cfg.adapter_dt}, the model's dtype ({lora_src})" if lora_src else "")
        + (
            f"; DeepSpeed casts the model to {c.sharding.model_dtype} (no autocast)"
            if c.sharding.model_dtype
            else ""
        ),
        inputs={
            **c.base,
            "dtype": c.sharding.model_dtype or c.rx.dtypes[0],
            "param_shard": c.sharding.param_shard,
            "bytes": c.res.param_bytes,
            "method": run.method,
            "precision": run.precision,
        },
        source="transformers modeling code (parameter shapes, gpumem_gui.core.spec.params); "
        + (f"{_QUANT_BASE[int8][1]}; " if qlora else "")
        + (
            "deepspeed/runtime/engine.py _configure_distributed_model (module.bfloat16() / half())"
            if c.sharding.model_dtype
            else PRECISION_DOC[run.precision]
        ),
    )


def _gathered(c: _Ctx) -> Explanation:
    return gathered(c.run, c.base)  # FSDP2 / FSDP1 / ZeRO-3: training/fsdp_explain.py


def _gradients(c: _Ctx) -> Explanation:
    return Explanation(
        formula=(
            "fp32 main_grad buffer: 4 B x trainable parameters"
            if c.run.precision == "megatron-bf16"
            else "one gradient like each trainable parameter, created when backward reaches it"
        )
        + (" / data-parallel shard (reduce-scattered as they appear)" if c.sharding.grads_sharded else "")
        + (
            "; gradient_as_bucket_view: each .grad is a view of the DDP reducer's flat buckets (allocated "
            "when DistributedDataParallel is built, alive for the whole run)"
            if c.sharding.ddp_buckets and c.run.bucket_view
            else ""
        ),
        inputs={
            **c.base,
            "trainable_params": c.res.trainable_params,
            "bytes_after_backward": c.res.grad_bytes,
            "grad_accum": c.run.grad_accum,
        },
        source="torch/csrc/autograd/functions/accumulate_grad.h (gradient stolen into .grad, added in place "
        "when it exists: gradient accumulation)"
        + (
            "; optimizer in backward: each gradient stepped and freed as soon as it is accumulated, only "
            "those in flight exist (torchtune register_optim_in_bwd_hooks)"
            if c.run.optimizer_in_backward
            else ""
        )
        + (f"; {BUCKETS_SOURCE}" if c.sharding.ddp_buckets and c.run.bucket_view else "")
        + (f"; {GRADS_SOURCE}" if c.sharding.model_dtype else ""),
    )


def _states(c: _Ctx) -> Explanation:
    opt = c.rx.optimizer
    return Explanation(
        formula=opt.states
        + ("; + fp32 master weights 4 B/param" if c.run.precision == "megatron-bf16" else "")
        + (
            "; in fp32 on DeepSpeed's fp32 master partition, + the master weights 4 B/param"
            if c.sharding.master_bytes
            else ""
        )
        + ("; / data-parallel shard" if c.sharding.states_sharded and c.sharding.state_shard > 1 else "")
        + (f"; {FLAT_STEP_WHAT}" if c.sharding.flat_step is not None else "")
        + owner_text(c.res.state_owner, c.run.dp),
        inputs={
            **c.base,
            "optimizer": c.run.optimizer,
            "bytes": c.res.state_bytes,
            "trainable_params": c.res.trainable_params,
            "first_step": c.run.first_step,
        },
        source=opt.source
        + (f"; {ZERO_TORCH_SOURCE}" if c.res.state_owner else "")
        + (f"; {MASTER_SOURCE}" if c.sharding.master_bytes else "")
        + (f"; {FLAT_STEP_SOURCE}" if c.sharding.flat_step is not None else ""),
    )


def _temporaries(c: _Ctx) -> Explanation:
    opt = c.rx.optimizer
    flat = c.sharding.flat_step is not None
    return Explanation(
        formula=opt.temporaries + (f"; {FLAT_STEP_WHAT}" if flat else ""),
        inputs={**c.base, "optimizer": c.run.optimizer},
        source=opt.source + (f"; {FLAT_STEP_SOURCE}" if flat else ""),
    )


def _activations(tag: str) -> Callable[[_Ctx], Explanation]:
    def explain(c: _Ctx) -> Explanation:
        param_dt, autocast = c.rx.dtypes
        return Explanation(
            formula=_ACTIVATION_WHAT[tag],
            inputs={
                **c.base,
                "batch": c.run.batch,
                "seq_per_rank": c.cfg.q,
                "layers": c.rspec.num_layers,
                "hidden": c.rspec.hidden_size,
                "attn": c.cfg.attn,
                "grad_ckpt": c.run.grad_ckpt,
                "autocast": autocast,
                "activation_dtype": autocast or param_dt,
            },
            source="transformers 5.24 modeling code replayed on symbolic tensors "
            "(gpumem_gui.core.replay.model); saving rules of torch tools/autograd/derivatives.yaml; "
            "checked byte for byte against PyTorch MemTracker (shared/reference/groundtruth.json grid)"
            + c.rx.tricks,  # the framework's loss and memory tricks (training/profiles.py)
        )

    return explain


def _inputs(c: _Ctx) -> Explanation:
    return Explanation(
        formula="batch x seq x 8 B (int64)",
        inputs={**c.base, "batch": c.run.batch, "seq": c.cfg.q},
        source="definition",
    )


def _vision(c: _Ctx) -> Explanation:
    if c.cfg.train_tower:  # the tower trained on the images (replay/vision_train.py)
        return Explanation(
            formula="the processor's pixel_values (kept through the step), the trainable vision tower's "
            "activations saved for backward and its outputs alive through the language model's forward",
            inputs={**c.base, "images": c.run.images, "image_size": c.run.image_size},
            source="replay/vision_train.py embed_images (Gemma3Model.forward, SiglipVisionModel)",
        )
    if c.cfg.method != "full":  # LoRA: adapters on the tower, or the frozen tower hooked under checkpointing
        return Explanation(
            formula="the processor's pixel_values (kept through the step), the vision tower's activations "
            "(saved for backward from its first LoRA adapter on, or from its patch embedding when "
            "checkpointing makes PEFT hook it) and its outputs alive through the language model's forward",
            inputs={**c.base, "images": c.run.images, "lora_vision_tower": c.run.lora_vision_tower},
            source="replay/vision_train.py under_autograd, replay/vision_train_lora.py (PEFT lora.Linear, "
            "enable_input_require_grads)",
        )
    return Explanation(
        formula="the processor's pixel_values (kept through the step), the frozen vision tower's activations "
        "and its outputs alive through the language model's forward",
        inputs={**c.base, "images": c.run.images, "image_size": c.run.image_size},
        source="replay/vision.py train_prefix (the models' get_image_features)",
    )


def _buffers(c: _Ctx) -> Explanation:
    return Explanation(
        formula="rotary inv_freq buffers (fp32)", inputs=c.base, source="LlamaRotaryEmbedding.__init__"
    )


_EXPLAIN: dict[str, Callable[[_Ctx], Explanation]] = {
    "parameters": _parameters,
    "gathered parameters": _gathered,
    "gradients": _gradients,
    "gradient buckets": lambda c: bucket_explanation(c.run, c.res.trainable_params, c.base),
    "reduce bucket": lambda c: zero_explanation("reduce bucket", c.run, c.res.trainable_params, c.base),
    "fp32 gradient partition": lambda c: zero_explanation(
        "fp32 gradient partition", c.run, c.res.trainable_params, c.base
    ),
    "optimizer states": _states,
    "optimizer temporaries": _temporaries,
    **{tag: _activations(tag) for tag in _ACTIVATION_WHAT},
    "input ids": _inputs,
    "vision": _vision,
    "buffers": _buffers,
    **{tag: (lambda c, f=f: f(c.run, c.base)) for tag, f in FSDP_EXPLAIN.items()},
}


def components(
    by_tag: dict[str, int],
    run: TrainingRun | RunExplained,
    res: StepResult,
    cfg: ReplayConfig,
    rspec: ModelSpec,
    where: str,
) -> list[Component]:
    """The components of one phase's peak (bytes by replay tag), explained (``run``: or what the
    explanations read of it, worked out once for the estimate's phases and stages)."""
    ctx = _Ctx(run if isinstance(run, RunExplained) else RunExplained(run), res, cfg, rspec, where)
    # the forward's regions (hidden states, attention, MLP, norms, rotary, masks, inputs) are its activations
    by_tag = {**by_tag, "activations": sum(by_tag.get(r, 0) for r in REGIONS)}
    out = []
    for tag, key, label in _TAGS:
        n = by_tag.get(tag, 0)
        if n > 0:
            out.append(Component(key=key, label=label, bytes=n, explain=_EXPLAIN[tag](ctx)))
    return out


def extra_component(key: str, label: str, n: int, formula: str, inputs: dict, source: str) -> Component:
    return Component(
        key=key, label=label, bytes=n, explain=Explanation(formula=formula, inputs=inputs, source=source)
    )
