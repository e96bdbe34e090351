"""Cross-checks of a training run against a model: what the run model alone cannot validate."""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.adapters import ALL_LINEAR
from gpumem_gui.core.replay.model import model_tensors
from gpumem_gui.core.spec import gemma4
from gpumem_gui.core.spec.compressed import NOT_REPLAYED
from gpumem_gui.core.spec.kinds import CompressedAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, check_degrees
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.model_parallel import shard_run
from gpumem_gui.core.training.precision import precision
from gpumem_gui.core.training.profiles import check as check_profile
from gpumem_gui.core.training.profiles import profile
from gpumem_gui.core.training.run import TrainingRun
from gpumem_gui.core.training.seq2seq import check_seq2seq_training
from gpumem_gui.core.training.unused import unused_notes


def _check_compressed(run: TrainingRun) -> None:
    """DeepSeek-V4's training step is replayed (and measured) for a full fine-tune without model
    parallelism, compiled layers or float8 linears; anything else is refused in one line."""
    unsupported = {
        "method": run.method != "full",
        "tp": run.tp > 1,
        "pp": run.pp > 1,
        "cp": run.cp > 1,
        "compile": run.compile,
        "float8": run.float8,
    }
    for field, bad in unsupported.items():
        if bad:
            raise GpumemInputError(f"training: {NOT_REPLAYED} ({field} {getattr(run, field)})", field=field)


def lora_targets(run: TrainingRun) -> tuple[str, ...]:
    return (ALL_LINEAR,) if run.lora_targets == ALL_LINEAR else tuple(run.lora_targets)


def _check_adapters(spec: ModelSpec, run: TrainingRun) -> list[str]:
    if precision(run).adapters is None:
        raise GpumemInputError(
            f"{run.precision} is a full fine-tuning regime; use amp-bf16 or bf16 for {run.method}",
            field="precision",
        )
    tensors = model_tensors(spec)
    chosen = adapters.lora_targets(spec, tensors, lora_targets(run))  # names the modules on a miss
    if not chosen:
        raise GpumemInputError("this model has no linear layer for LoRA adapters", field="lora_targets")
    warnings = []
    modules = adapters.linear_modules(spec, tensors)
    shapes = {t.name: t.shape for t in tensors} | {t.name: t.shape for ts in modules.values() for t in ts}
    smallest = min(min(shapes[name]) for name in chosen)
    if run.lora_rank > smallest:
        warnings.append(
            f"lora_rank: {run.lora_rank} exceeds the smallest targeted layer dimension ({smallest}); PEFT "
            "builds such adapters, but they hold more than the layer they adapt"
        )
    if spec.moe is not None:
        # peft 0.21 utils/transformers_weight_conversion.py, _convert_peft_config_moe: v4 expert / router
        # targets become target_parameters on transformers 5's fused expert stacks (ParamWrapper), which
        # merges each layer's LoRA delta into a full-size copy of the stack in the forward
        warnings.append(
            "lora: PEFT 0.21 on transformers 5 also adapts the fused expert stacks and the router of many "
            "MoE models (and merges each layer's experts in the forward); this estimate adapts attention, "
            "dense/shared MLP linears and, when named as a target (gate), the router only: about half of "
            "the peak `gpumem trace` measures for Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V2-Lite; trace "
            "this model to know"
        )
    return warnings


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


def check_training(spec: ModelSpec, run: TrainingRun) -> tuple[str, ...]:
    """Cross-checks of ``run`` against ``spec``: errors raise :class:`GpumemInputError`, soft problems come
    back as warnings."""
    warnings: list[str] = [f"approximate: {spec.approximate}"] if spec.approximate else []
    if spec.altup is not None:  # Gemma 3n: replay/altup.py matches inference traces, not training ones yet
        warnings.append(f"approximate: {ALTUP_TRAINING}")
    la = spec.linear_attention
    if la is not None and la.kind == "lightning" and run.grad_ckpt:
        warnings.append(f"approximate: {LIGHTNING_TRAINING}")
    if model_kinds(spec).of(CompressedAttention):  # DeepSeek-V4 (spec/compressed.py, replay/dsv4.py)
        _check_compressed(run)
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
    warnings += unused_notes(run)  # fields this run does not use (training/unused.py)
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
