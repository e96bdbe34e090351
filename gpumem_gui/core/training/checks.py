"""Cross-checks of a training run against a model: what the run model alone cannot validate."""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import adapters, moe_lora, vision_train
from gpumem_gui.core.replay.adapters import ALL_LINEAR
from gpumem_gui.core.replay.model import lora_tensors, lora_weights
from gpumem_gui.core.replay.vision import has_tower
from gpumem_gui.core.replay.vision_train import adapts_tower, check_trainable
from gpumem_gui.core.replay.vision_train_lora import INPUT_EMBEDDINGS
from gpumem_gui.core.spec import gemma4
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, check_degrees
from gpumem_gui.core.spec.params import Tensor
from gpumem_gui.core.training.compressed import check_compressed_training
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.model_parallel import shard_run
from gpumem_gui.core.training.precision import precision
from gpumem_gui.core.training.profiles import check as check_profile
from gpumem_gui.core.training.profiles import profile
from gpumem_gui.core.training.run import TrainingRun
from gpumem_gui.core.training.seq2seq import check_seq2seq_training
from gpumem_gui.core.training.unused import unused_notes


def lora_targets(run: TrainingRun) -> tuple[str, ...]:
    return (ALL_LINEAR,) if run.lora_targets == ALL_LINEAR else tuple(run.lora_targets)


def expert_linears(run: TrainingRun) -> bool:
    """The routed experts are transformers 4's per-expert Linear4bit modules (qlora_experts 4bit-linear:
    replay/moe_per_expert.py), which PEFT adapts as linears (no ParamWrapper)."""
    return run.method == "qlora" and run.qlora_experts == "4bit-linear"


def _expert_storage(spec: ModelSpec, tensors: tuple[Tensor, ...], run: TrainingRun) -> list[str]:
    """What the estimate assumed for a 4-bit base's routed experts (run field qlora_experts) and why."""
    if run.method != "qlora" or not any(moe_lora.is_stack(t.name, t.shape) for t in tensors):
        return []
    if run.qlora_experts == "4bit-linear" and not spec.traits.peft_expert_targets:
        raise GpumemInputError(
            "4bit-linear is modelled where the transformers 4 names of the experts' projections are known "
            "(the Mixtral and Qwen2-MoE patterns PEFT converts); not for this model type: use bf16 or 4bit",
            field="qlora_experts",
        )
    if run.qlora_base == "int8":
        if run.qlora_experts != "bf16":
            raise GpumemInputError(
                f"{run.qlora_experts} needs a 4-bit base (qlora_base nf4 or nf4-dq): Linear8bitLt leaves "
                "fused expert stacks alone, and so does this estimate",
                field="qlora_experts",
            )
        return ["qlora_experts: the routed expert stacks are bf16 (LLM.int8 replaces nn.Linear modules only)"]
    if run.qlora_experts == "4bit":
        return [
            "qlora_experts: the routed experts are 4-bit as Axolotl's quantize_moe_experts stores them; "
            "each MoE layer's stacks are dequantized whole when read and the copy is kept for backward "
            "(transformers < 5's per-expert Linear4bit dequantizes one expert at a time: qlora_experts "
            "4bit-linear)"
        ]
    if run.qlora_experts == "4bit-linear":
        return [
            "qlora_experts: the routed experts are one Linear4bit per expert projection as transformers < 5 "
            "builds them, looped over the experts hit with tokens spread evenly; one expert's weight is "
            "dequantized per call and none is kept for backward; PEFT adapts each expert's linears named by "
            "the targets (lora_A / lora_B per expert) and converts nothing: dense and shared-expert linears "
            "named alike keep their adapters (a router target runs as a merged weight, as on transformers 5)"
        ]
    return [
        "qlora_experts: the routed experts are bf16, as transformers >= 5 loads a 4-bit base (its fused "
        "3-D expert stacks are no nn.Linear, bitsandbytes skips them); they are most of an MoE's weights: "
        "set qlora_experts 4bit for Axolotl's quantize_moe_experts, 4bit-linear for transformers < 5's "
        "Linear4bit experts"
    ]


def _check_adapters(spec: ModelSpec, run: TrainingRun) -> list[str]:
    """:func:`_adapter_checks`, once per model and adapter settings: it reads neither the micro-batch, the
    sequence nor the accumulation, and walking the model's linear modules costs ~5 ms a point on an 8B model
    (the point's fields are set to 1 in the key, so a run differing only there finds the same entry)."""
    try:
        hash(spec)
    except TypeError:  # a spec with an unhashable field: checked without the cache
        return list(_adapter_checks.__wrapped__(spec, run))
    return list(_adapter_checks(spec, run.model_copy(update=POINT_FREE)))


# the fields of a training run that make its point, as a point-free key sets them (definition)
POINT_FREE = {"batch": 1, "seq": 1, "grad_accum": 1}


@lru_cache(maxsize=64)
def _unused_notes(run: TrainingRun) -> tuple[str, ...]:
    """:func:`~gpumem_gui.core.training.unused.unused_notes` (training/unused.py) once per run shape: it reads
    no point field (keyed as :func:`_check_adapters` is)."""
    return tuple(unused_notes(run))


@lru_cache(maxsize=64)
def _adapter_checks(spec: ModelSpec, run: TrainingRun) -> tuple[str, ...]:
    if precision(run).adapters is None:
        raise GpumemInputError(
            f"{run.precision} is a full fine-tuning regime; use amp-bf16 or bf16 for {run.method}",
            field="precision",
        )
    tensors = lora_tensors(spec, run.lora_vision_tower)  # the vision tower's linears as far as it reaches
    # names the modules on a miss
    chosen = adapters.lora_targets(spec, tensors, lora_targets(run), not expert_linears(run))
    if not chosen:
        raise GpumemInputError("this model has no linear layer for LoRA adapters", field="lora_targets")
    warnings = []
    modules = adapters.linear_modules(spec, tensors)
    shapes = {t.name: t.shape for t in tensors} | {t.name: t.shape for ts in modules.values() for t in ts}
    smallest = min(min(shapes[name][-2:]) for name in chosen)  # an expert stack: (experts, out, in)
    if run.lora_rank > smallest:
        warnings.append(
            f"lora_rank: {run.lora_rank} exceeds the smallest targeted layer dimension ({smallest}); PEFT "
            "builds such adapters, but they hold more than the layer they adapt"
        )
    stacks = sorted({name.rsplit(".", 1)[-1] for name in chosen if len(shapes[name]) == 3})
    stacks = [] if expert_linears(run) else stacks  # transformers 4: no ParamWrapper, no conversion
    wrapped = bool(stacks) or any(adapters.is_router(t) and t.name in chosen for t in tensors)
    if wrapped and run.lora_dropout > 0:  # peft tuners/lora/layer.py ParamWrapper.__init__ raises
        raise GpumemInputError(
            f"must be 0 when the expert stacks or the router are targets, got {run.lora_dropout}: PEFT's "
            "ParamWrapper refuses dropout (name the attention projections only to keep it)",
            field="lora_dropout",
        )
    warnings += _expert_storage(spec, tensors, run)
    if stacks:
        # peft 0.21 utils/transformers_weight_conversion.py _convert_peft_config_moe (see replay/moe_lora.py)
        warnings.append(
            f"lora: PEFT on transformers 5 adapts the fused expert stacks ({', '.join(stacks)}) as "
            "parameters "
            "(ParamWrapper) and merges a full-size copy of each, kept for backward, in every MoE layer's "
            "forward; MLP linears named like the experts' v4 projections (dense layers, shared experts) "
            "get no adapters"
        )
    return tuple(warnings)


def _check_model_parallel(spec: ModelSpec, run: TrainingRun) -> list[str]:
    """Sequence parallelism and the pipeline schedules: what the runtimes refuse, and what changes nothing."""
    warnings = []
    if run.sequence_parallel and run.tp > 1:
        if spec.parallel_attn_mlp or spec.traits.block != "llama":
            raise GpumemInputError(
                "sequence_parallel is modelled for sequential decoder blocks (attention, then MLP); this "
                "model runs them in parallel or in its own block: set sequence_parallel off",
                field="sequence_parallel",
            )
        if run.seq % (run.tp * run.cp):
            # Megatron-LM and DTensor Shard(1) split the sequence evenly over the TP ranks
            raise GpumemInputError(
                f"sequence_parallel: seq {run.seq} must be a multiple of tp x cp = {run.tp * run.cp}",
                field="sequence_parallel",
            )
    if run.pp_schedule == "interleaved-1f1b" and run.pp > 1:
        chunks = run.pp * run.pp_virtual
        if spec.num_layers % chunks and not profile(run).uneven_pp_split:
            # Megatron-LM transformer_config.py: num_layers_per_pipeline_rank % virtual_pipeline_size
            # (torchtitan splits unevenly: spec/parallel.py weighted_chunk_layers)
            raise GpumemInputError(
                f"pp_virtual: {spec.num_layers} layers do not split into pp x pp_virtual = {chunks} chunks",
                field="pp_virtual",
            )
        if run.grad_accum % run.pp:
            # Megatron-LM schedules.py forward_backward_pipelining_with_interleaving
            raise GpumemInputError(
                f"interleaved 1F1B needs micro-batches (grad_accum {run.grad_accum}) divisible by pp "
                f"({run.pp})",
                field="grad_accum",
            )
    return warnings


def _check_int8_base(run: TrainingRun) -> None:
    """An 8-bit bitsandbytes base (Int8Params) is not sharded: FSDP and DeepSpeed ZeRO-3 shard a quantized
    base only as 4-bit weights stored in a float dtype (BitsAndBytesConfig bnb_4bit_quant_storage, HF PEFT
    docs "FSDP + QLoRA", "DeepSpeed ZeRO-3 + QLoRA"); torchtune's QLoRA base is torchao's NF4Tensor only
    (torchtune/modules/low_precision/nf4_linear.py)."""
    where = (
        "FSDP"
        if run.fsdp != "none"
        else "DeepSpeed ZeRO-3"
        if run.zero == 3 and run.dp > 1
        else "torchtune"
        if run.framework == "torchtune"
        else None
    )
    if where is not None:
        raise GpumemInputError(
            f"qlora_base int8: {where} cannot run an 8-bit bitsandbytes base; use qlora_base nf4 or nf4-dq",
            field="qlora_base",
        )


# the Gemma 3n training replay against traces of a scaled-down Gemma 3n (synthetic__gemma3n-tiny, not in
# tests/reference/trace yet): +0.2 % (checkpointing) .. +4.5 % (LoRA), +1.6 % bf16, +2.0 % amp-bf16
ALTUP_TRAINING = (
    "Gemma 3n training activations (AltUp, Laurel, per-layer inputs under autograd) are within ~5 % of "
    "PyTorch's count on a scaled-down copy, not to the byte; weights, gradients and optimizer states are "
    "exact"
)

# the MiniMax training replay against traces of synthetic__minimax-tiny (not in tests/reference/trace yet):
# bf16 eager and amp-bf16 SDPA to the byte, +0.9 % with activation checkpointing (LoRA: see the MoE warning)
LIGHTNING_TRAINING = (
    "MiniMax training with lightning attention and activation checkpointing is ~1 % above PyTorch's count "
    "on a scaled-down copy (without checkpointing it matches)"
)


# the run's lora_vision_tower in words (run_adapters.py LoraVisionTower)
_REACH = {
    "targets": "the targets resolved over the whole model as PEFT's get_peft_model does",
    "tower": "the projector left out as LLaMA-Factory does with freeze_vision_tower: false",
    "excluded": "the tower and projector left out as LLaMA-Factory's freeze_vision_tower default does",
}


def _tower_lora(spec: ModelSpec, run: TrainingRun) -> list[str]:
    """Whether LoRA adapters reach the vision tower, and why (replay/vision_train.py tower_linears), and
    whether the frozen tower runs under autograd (replay/vision_train_lora.py)."""
    if run.method == "full" or not adapts_tower(spec):
        return []
    reach = run.lora_vision_tower
    tower = vision_train.tower_linears(spec, reach)
    adapted = lora_weights(spec, lora_targets(run), reach)
    n = sum(1 for t in tower if t.name in adapted)
    note = f"vision tower: LoRA adapters on {n} linears of the tower and projector "
    note += f"(lora_vision_tower {reach}: {_REACH[reach]})"
    if not n and run.grad_ckpt and spec.vision.tower.kind in INPUT_EMBEDDINGS:  # type: ignore[union-attr]
        note += "; with checkpointing enable_input_require_grads runs the frozen tower under autograd"
    return [note]


def _text_step_tower(spec: ModelSpec, run: TrainingRun) -> list[str]:
    """A text-only LoRA step of a VLM whose targets reach the tower: PEFT builds those adapters too, counted
    as trainable parameters that get no gradient (replay/vision_train_lora.py unused_adapters); where the
    tower is not replayed its linears are unknown here (a note)."""
    if run.method == "full" or spec.vision is None or run.lora_vision_tower == "excluded":
        return []
    if not adapts_tower(spec):
        return [
            "vision tower: a text-only step; PEFT also puts LoRA adapters on the tower's linears that the "
            "targets name, which are not counted (this tower is not replayed; lora_vision_tower excluded "
            "leaves them out)"
        ]
    tower = vision_train.tower_linears(spec, run.lora_vision_tower)
    adapted = lora_weights(spec, lora_targets(run), run.lora_vision_tower)
    n = sum(run.lora_rank * sum(t.shape) for t in tower if t.name in adapted)
    if not n:
        return []
    return [
        f"vision tower: a text-only step; PEFT also puts LoRA adapters ({n} parameters) on the tower's "
        f"linears (lora_vision_tower {run.lora_vision_tower}): counted, with no gradient or optimizer state "
        "(no image reaches them)"
    ]


def _check_images(spec: ModelSpec, run: TrainingRun) -> list[str]:
    """Images on a model whose tower is not replayed are not counted; with adapters, where they reach the
    tower (a note), and the frozen tower under autograd with checkpointing where it is not replayed so."""
    if not run.images:  # a train_vision_tower without images is noted as ignored (training/unused.py)
        return _text_step_tower(spec, run)
    if run.train_vision_tower:  # replay/vision_train.py: full fine-tuning of a replayed tower
        check_trainable(spec, run.method)
    if not has_tower(spec):
        return ["images: the model's vision tower is not replayed in training; the images are not counted"]
    return _tower_lora(spec, run)


def check_training(spec: ModelSpec, run: TrainingRun) -> tuple[str, ...]:
    """Cross-checks of ``run`` against ``spec``: errors raise :class:`GpumemInputError`, soft problems come
    back as warnings."""
    warnings: list[str] = [f"approximate: {spec.approximate}"] if spec.approximate else []
    if spec.altup is not None:  # Gemma 3n: replay/altup.py matches inference traces, not training ones yet
        warnings.append(f"approximate: {ALTUP_TRAINING}")
    la = spec.linear_attention
    if la is not None and la.kind == "lightning" and run.grad_ckpt:
        warnings.append(f"approximate: {LIGHTNING_TRAINING}")
    check_compressed_training(spec, run, lora_targets(run))  # DeepSeek-V4 (training/compressed.py)
    check_seq2seq_training(spec, run)  # encoder-decoders: one GPU, full or LoRA (training/seq2seq.py)
    check_degrees(spec, Degrees(tp=run.tp, pp=run.pp, ep=run.ep))
    gemma4.check_run(spec, tp=run.tp, pp=run.pp, ep=run.ep, cp=run.cp)  # Gemma 4: one GPU (spec/gemma4.py)
    stateful = spec.linear_attention is not None or spec.short_conv is not None or spec.mamba is not None
    if stateful and (run.tp > 1 or run.cp > 1):
        raise GpumemInputError(
            "tensor and context parallelism of linear-attention layers are not modelled yet; use tp 1, cp 1",
            field="tp" if run.tp > 1 else "cp",
        )
    if run.ep > 1 and (run.dp * run.tp) % run.ep:
        raise GpumemInputError(
            f"expert parallel degree {run.ep} must divide dp x tp = {run.dp * run.tp} (expert ranks are "
            "carved out of the data- and tensor-parallel ranks)",
            field="ep",
        )
    warnings += _check_model_parallel(spec, run)
    warnings += _check_images(spec, run)  # a frozen vision tower (replay/vision.py train_prefix)
    if run.frozen_layers > spec.num_layers:
        raise GpumemInputError(
            f"frozen_layers ({run.frozen_layers}) exceeds the {spec.num_layers} layers", field="frozen_layers"
        )
    if run.method != "full":
        warnings += _check_adapters(spec, run)
    if run.attn == "flash" and run.precision == "fp32":
        raise GpumemInputError("flash attention needs fp16 or bf16 activations", field="attn")
    if precision(run).fsdp_only and run.fsdp == "none":
        raise GpumemInputError(
            f"precision {run.precision} is FSDP's MixedPrecisionPolicy: it needs fsdp (full_shard, "
            "shard_grad_op, hybrid_shard); without FSDP use amp-bf16 or bf16",
            field="precision",
        )
    # a framework checks the run as its sharding sees it: FSDP and ZeRO over the dp x cp ranks
    # (torchtitan's dp_shard_cp mesh), so FSDP 1 x CP 8 has eight ranks to shard over
    warnings += framework(run).check(spec, shard_run(run))
    warnings += check_profile(run)  # the framework profile's offers and the tricks' limits
    warnings += _unused_notes(run.model_copy(update=POINT_FREE))  # fields this run does not use
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
    if run.method == "qlora" and run.qlora_base == "int8":
        _check_int8_base(run)
    if run.method == "qlora" and run.grad_ckpt is False:
        warnings.append(
            "qlora: PEFT's prepare_model_for_kbit_training usually turns gradient checkpointing on"
        )
    return tuple(warnings)
