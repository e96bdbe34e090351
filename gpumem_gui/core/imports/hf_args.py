"""Hugging Face ``TrainingArguments`` / TRL ``SFTConfig`` files (the JSON or YAML ``HfArgumentParser``
reads: ``parse_json_file``, ``trl sft --config``), read as a :class:`TrainingRun` with framework
``hf-trainer`` or ``trl``.

Field names as ``transformers/training_args.py`` (``TrainingArguments``), ``trl/trainer/sft_config.py``
(``SFTConfig``: ``max_length``, formerly ``max_seq_length``; ``use_liger_kernel``, ``activation_offloading``)
and ``trl/trainer/model_config.py`` (``ModelConfig``: ``model_name_or_path``, ``torch_dtype``, ``use_peft``,
``lora_r``, ``lora_alpha``, ``lora_target_modules``, ``load_in_4bit``) declare them. :func:`trainer_keys` is
shared with LLaMA-Factory, whose YAML is the same ``HfArgumentParser`` over its own dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading, words
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import deepspeed_reference, hf_optim, lora_targets

TRAINER_NO_MEMORY = words(
    "output_dir overwrite_output_dir do_train do_eval do_predict eval_strategy evaluation_strategy "
    "prediction_loss_only per_device_eval_batch_size eval_accumulation_steps eval_delay learning_rate "
    "weight_decay adam_beta1 adam_beta2 adam_epsilon max_grad_norm num_train_epochs max_steps "
    "lr_scheduler_type "
    "lr_scheduler_kwargs warmup_ratio warmup_steps log_level log_level_replica log_on_each_node logging_dir "
    "logging_strategy logging_first_step logging_steps logging_nan_inf_filter save_strategy save_steps "
    "save_total_limit save_safetensors save_on_each_node save_only_model seed data_seed tf32 local_rank "
    "ddp_backend dataloader_drop_last eval_steps dataloader_num_workers dataloader_prefetch_factor "
    "past_index "
    "run_name disable_tqdm remove_unused_columns label_names load_best_model_at_end metric_for_best_model "
    "greater_is_better ignore_data_skip report_to ddp_find_unused_parameters ddp_timeout "
    "dataloader_pin_memory "
    "dataloader_persistent_workers skip_memory_metrics push_to_hub resume_from_checkpoint hub_model_id "
    "hub_strategy hub_token hub_private_repo gradient_checkpointing_kwargs include_inputs_for_metrics "
    "include_for_metrics full_determinism torch_compile_backend torch_compile_mode include_tokens_per_second "
    "include_num_input_tokens_seen neftune_noise_alpha group_by_length length_column_name "
    "average_tokens_across_devices eval_on_start batch_eval_metrics model_revision trust_remote_code "
    "dataset_name dataset_text_field dataset_num_proc dataset_config dataset_mixture chat_template "
    "train_file "
    "template_name bf16_full_eval fp16_full_eval fp16_opt_level half_precision_backend debug hub_always_push "
    "use_legacy_prediction_loop optim_args ddp_broadcast_buffers dataloader_sampler sortish_sampler "
    "predict_with_generate generation_max_length generation_num_beams env completion_only_loss "
    "assistant_only_loss dataset_kwargs eos_token pad_token packing_strategy model_init_kwargs"
)
_TRL_KEYS = (
    "max_length",
    "packing",
    "dataset_text_field",
    "completion_only_loss",
    "assistant_only_loss",
    "activation_offloading",
    "padding_free",
    "use_peft",
    "dataset_mixture",
)
_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "auto": None,
}
_FSDP = {"full_shard": "full_shard", "shard_grad_op": "shard_grad_op", "hybrid_shard": "hybrid_shard"}


class TrainerArguments:
    name = "Trainer / TRL arguments"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        return any(
            k in data for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "optim")
        ) or ("model_name_or_path" in data)

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        trl = any(k in data for k in _TRL_KEYS)
        r = Reading("TRL SFTConfig arguments" if trl else "Trainer arguments", file=path)
        r.fields["framework"] = "trl" if trl else "hf-trainer"
        top = Keys(data, r)
        model = top.str("model_name_or_path")
        if model:
            top.note("model_name_or_path", "model")
        peft_model(top)
        trainer_keys(top, r, path)
        top.set("seq", "max_length", top.int("max_length", lo=1, hi=1 << 24))
        top.set("seq", "max_seq_length", top.int("max_seq_length", lo=1, hi=1 << 24))
        top.set("activation_offload", "activation_offloading", top.bool("activation_offloading"))
        top.note("packing", "packed sequences: each of max_length tokens")
        top.no_memory(TRAINER_NO_MEMORY)
        top.rest()
        return r.training(model)


def peft_model(top: Keys) -> None:
    """TRL ``ModelConfig`` and similar: dtype, attention, PEFT and 4-bit loading."""
    r = top.reading
    dtype = top.str("torch_dtype") or top.str("dtype")
    key = "torch_dtype" if top.has("torch_dtype") else "dtype"
    if dtype is not None and _DTYPES.get(dtype.lower(), "x") == "bf16":
        top.set("precision", key, "bf16", "precision = bf16 (weights loaded in bf16: no fp32 master copy)")
        r.fields["_dtype"] = "bf16"
    top.set("attn", "attn_implementation", _attn(top.str("attn_implementation")))
    lora = top.bool("use_peft") or any(top.has(k) for k in ("lora_r", "lora_rank"))
    four = bool(top.bool("load_in_4bit")) or top.str("train_mode") == "qlora"
    eight = bool(top.bool("load_in_8bit"))
    mode = top.str("train_mode")  # Firefly's own switch (component/argument.py): full, lora, qlora
    if mode in ("full", "lora", "qlora"):
        lora, four = mode != "full", mode == "qlora"
    if lora or four:
        method = "qlora" if four or (eight and lora) else "lora"
        names = ("load_in_4bit", "train_mode", "load_in_8bit", "use_peft", "lora_r", "lora_rank")
        key = next((k for k in names if top.has(k)), "")
        top.set("method", key, method)
        for k in ("lora_r", "lora_rank"):
            top.set("lora_rank", k, top.int(k, lo=1, hi=1 << 16))
        top.set("lora_alpha", "lora_alpha", top.float("lora_alpha", lo=1e-9, hi=1 << 20))
        top.set("lora_dropout", "lora_dropout", top.float("lora_dropout", lo=0, hi=0.999))
        lora_targets(top, "lora_target_modules")
        if top.bool("use_bnb_nested_quant") or top.bool("bnb_4bit_use_double_quant"):
            top.set("qlora_base", "use_bnb_nested_quant", "nf4-dq")
    if eight and lora and not four:
        # TRL ModelConfig load_in_8bit -> get_quantization_config: BitsAndBytesConfig(load_in_8bit=True)
        top.set("qlora_base", "load_in_8bit", "int8", "qlora_base = int8 (bitsandbytes load_in_8bit)")
    elif eight:
        top.warn("load_in_8bit", "an 8-bit base is modelled with a LoRA adapter (use_peft) only; ignored")
    top.warn("lora_modules_to_save", "fully trained extra modules are not modelled")
    top.no_memory(
        ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_use_double_quant"), "read with QLoRA"
    )
    top.warn("use_unsloth", "unsloth's kernels are not applied (give --framework unsloth)")


def _attn(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.lower()
    return "flash" if "flash" in v else "eager" if v == "eager" else "sdpa"


def trainer_keys(top: Keys, r: Reading, path: str) -> None:
    """The ``TrainingArguments`` fields that change memory."""
    top.set("batch", "per_device_train_batch_size", top.int("per_device_train_batch_size", lo=1, hi=1 << 20))
    top.set(
        "grad_accum", "gradient_accumulation_steps", top.int("gradient_accumulation_steps", lo=1, hi=1 << 16)
    )
    top.set("grad_ckpt", "gradient_checkpointing", top.bool("gradient_checkpointing"))
    loaded_bf16 = r.fields.pop("_dtype", None) == "bf16"
    if top.bool("bf16") and not loaded_bf16:
        top.set("precision", "bf16", "amp-bf16", "precision = amp-bf16 (fp32 weights, bf16 autocast)")
    if top.bool("fp16"):
        top.set("precision", "fp16", "amp-fp16", "precision = amp-fp16 (fp32 weights, fp16 autocast)")
    hf_optim(top, "optim")
    top.set("compile", "torch_compile", top.bool("torch_compile"))
    if top.bool("use_liger_kernel"):
        top.set("loss", "use_liger_kernel", "fused-linear", "loss = fused-linear (Liger fused linear CE)")
    top.set("bucket_cap_mb", "ddp_bucket_cap_mb", top.float("ddp_bucket_cap_mb", lo=1e-6, hi=1 << 20))
    top.warn("auto_find_batch_size", "the batch the Trainer settles on is not modelled (the micro-batch is)")
    deepspeed_reference(top, "deepspeed", path)
    _fsdp(top)
    _accelerator_config(top)


def _accelerator_config(top: Keys) -> None:
    """``accelerator_config`` (transformers trainer_pt_utils.py AcceleratorConfig): only
    ``gradient_accumulation_kwargs.sync_each_batch`` changes memory, a gradient sync on every micro-batch
    instead of the Trainer's no_sync (accelerate GradientAccumulationPlugin)."""
    if isinstance(top.raw("accelerator_config"), str):
        top.warn("accelerator_config", "a JSON file gpumem does not read (sync_each_batch: give --grad-sync)")
        return
    cfg = top.sub("accelerator_config")
    if cfg is None:
        return
    kwargs = cfg.sub("gradient_accumulation_kwargs")
    if kwargs is not None:
        sync = kwargs.bool("sync_each_batch")
        kwargs.set("grad_sync", "sync_each_batch", None if sync is None else "each" if sync else "last")
        kwargs.rest()
    cfg.no_memory(
        ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking")
    )
    cfg.rest()


def _fsdp(top: Keys) -> None:
    value = top.raw("fsdp")
    if value in (None, "", [], False):
        return
    parts = value if isinstance(value, list) else str(value).split()
    strategy = next((_FSDP[p] for p in map(str, parts) if p in _FSDP), None)
    if strategy is None:
        top.warn("fsdp", "no sharding strategy named (full_shard, shard_grad_op, hybrid_shard)")
        return
    top.set("fsdp", "fsdp", strategy)
    if "offload" in parts:
        top.set("offload", "fsdp", "optimizer+params", "offload = optimizer+params (FSDP CPU offload)")
    cfg = top.sub("fsdp_config")
    if cfg is not None:
        fsdp_config(cfg, "")


def fsdp_config(cfg: Keys, prefix: str) -> None:
    """An ``fsdp_config`` block (Trainer, Axolotl, accelerate: keys with or without the ``fsdp_`` prefix)."""

    def key(name: str) -> str:
        return f"fsdp_{name}" if f"fsdp_{name}" in cfg.data else name

    version = cfg.int(key("version"), lo=1, hi=2)
    cfg.set("fsdp_version", key("version"), version)
    if cfg.bool(key("offload_params")):
        cfg.set("offload", key("offload_params"), "optimizer+params", "offload = optimizer+params")
    strategy = cfg.raw(key("sharding_strategy"))
    if strategy is not None:
        name = {"1": "full_shard", "2": "shard_grad_op", "4": "hybrid_shard"}.get(
            str(strategy), str(strategy).lower()
        )
        if name not in _FSDP:
            cfg.warn(key("sharding_strategy"), "a sharding strategy gpumem does not model")
        else:
            cfg.set("fsdp", key("sharding_strategy"), name)
    reshard = cfg.raw(key("reshard_after_forward"))
    if isinstance(reshard, str) and reshard.upper() in ("SHARD_GRAD_OP", "NO_SHARD"):
        cfg.set("fsdp", key("reshard_after_forward"), "shard_grad_op")
    elif reshard is False:
        cfg.set("fsdp", key("reshard_after_forward"), "shard_grad_op", "fsdp = shard_grad_op (no reshard)")
    if cfg.bool(key("activation_checkpointing")):
        cfg.set("grad_ckpt", key("activation_checkpointing"), True)
    cfg.no_memory(
        [
            key(k)
            for k in (
                "auto_wrap_policy",
                "transformer_layer_cls_to_wrap",
                "backward_prefetch",
                "forward_prefetch",
                "state_dict_type",
                "sync_module_states",
                "use_orig_params",
                "cpu_ram_efficient_loading",
                "limit_all_gathers",
                "min_num_params",
            )
        ]
    )
    cfg.rest()


PARSERS = (TrainerArguments(),)
