"""Axolotl config YAML files (``examples/<model>/*.yml``), read as a :class:`TrainingRun` with framework
``axolotl``. Keys as ``src/axolotl/utils/schemas/config.py`` (``AxolotlInputConfig``) declares them:
``base_model``, ``adapter`` (lora / qlora), ``lora_r``, ``lora_alpha``, ``lora_target_modules`` /
``lora_target_linear``, ``sequence_len``, ``micro_batch_size``, ``gradient_accumulation_steps``,
``gradient_checkpointing`` (true or ``offload``), ``bf16``/``fp16``, ``optimizer``, ``deepspeed``, ``fsdp`` /
``fsdp_config`` / ``fsdp_version``, ``flash_attention`` / ``attn_implementation``, ``load_in_4bit``, and
the Liger
and Cut Cross-Entropy plugins. Axolotl loads the model in the training dtype (``bf16: true`` or ``auto`` on a
bf16 GPU: bf16 weights, no fp32 master copy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import short
from gpumem_gui.core.imports.base import ImportedRun, Reading, bad, words
from gpumem_gui.core.imports.hf_args import fsdp_config
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import HF_OPTIM, deepspeed_reference, lora_targets

_NO_MEMORY = words(
    "datasets dataset_prepared_path val_set_size output_dir num_epochs lr_scheduler learning_rate "
    "warmup_ratio "
    "warmup_steps evals_per_epoch saves_per_epoch weight_decay logging_steps special_tokens wandb_project "
    "wandb_entity wandb_watch wandb_name wandb_log_model tf32 resume_from_checkpoint chat_template "
    "model_type "
    "tokenizer_type dataset_processes seed strict eval_sample_packing train_on_inputs group_by_length "
    "early_stopping_patience local_rank gradient_checkpointing_kwargs lora_model_dir hub_model_id max_steps "
    "eval_steps save_steps debug min_sample_len trust_remote_code eval_table_size save_total_limit "
    "shuffle_merged_datasets dataset_exact_deduplication auto_resume_from_checkpoints save_safetensors "
    "max_grad_norm eval_max_new_tokens eval_causal_lm_metrics save_strategy eval_strategy "
    "loss_watchdog_threshold "
    "loss_watchdog_patience special_tokens use_tensorboard is_llama_derived_model "
    "is_mistral_derived_model hf_use_auth_token dataloader_num_workers dataloader_pin_memory "
    "dataloader_prefetch_factor remove_unused_columns adam_beta1 adam_beta2 adam_epsilon cosine_min_lr_ratio "
    "base_model_config tokenizer_config processor_type"
)
_LIGER_OTHER = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm", "liger_swiglu")


class AxolotlConfig:
    name = "Axolotl config"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        return "base_model" in data

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("Axolotl config", file=path)
        r.fields["framework"] = "axolotl"
        top = Keys(data, r)
        model = top.str("base_model")
        top.note("base_model", "model")
        _adapter(top)
        _step(top)
        _precision(top)
        _kernels(top)
        deepspeed_reference(top, "deepspeed", path)
        r.fields["framework"] = "axolotl"  # a deepspeed file does not change who runs the training
        _sharding(top)
        top.no_memory(_NO_MEMORY)
        top.rest()
        return r.training(model)


def _adapter(top: Keys) -> None:
    adapter = (top.str("adapter") or "").lower()
    four = bool(top.bool("load_in_4bit"))
    eight = bool(top.bool("load_in_8bit"))
    if adapter in ("lora", "qlora") or four:
        method = "qlora" if adapter == "qlora" or four or eight else "lora"
        top.set("method", "adapter" if adapter else "load_in_4bit", method)
        if eight and not four and adapter != "qlora":
            # Axolotl's model loader: load_in_8bit -> BitsAndBytesConfig(load_in_8bit=True) (LLM.int8)
            top.set("qlora_base", "load_in_8bit", "int8", "qlora_base = int8 (bitsandbytes load_in_8bit)")
        elif four and adapter == "qlora":
            # Axolotl's model loader (loaders/model.py, adapter qlora + load_in_4bit): BitsAndBytesConfig(
            # bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4", ...)
            top.set("qlora_base", "adapter", "nf4-dq", "qlora_base = nf4-dq (Axolotl's QLoRA: double quant)")
        top.set("lora_rank", "lora_r", top.int("lora_r", lo=1, hi=1 << 16))
        top.set("lora_alpha", "lora_alpha", top.float("lora_alpha", lo=1e-9, hi=1 << 20))
        top.set("lora_dropout", "lora_dropout", top.float("lora_dropout", lo=0, hi=0.999))
        if top.bool("lora_target_linear"):
            top.set("lora_targets", "lora_target_linear", "all-linear")
        lora_targets(top, "lora_target_modules")
    elif adapter:
        top.warn("adapter", "an adapter gpumem does not model (lora, qlora)")
    if eight and (four or adapter == "qlora"):
        top.warn(
            "load_in_8bit", "with a 4-bit base (load_in_4bit / adapter qlora); the 4-bit base is estimated"
        )
    elif eight and adapter not in ("lora", "qlora"):
        top.warn("load_in_8bit", "an 8-bit base without a LoRA adapter is not modelled (full fine-tuning)")
    top.warn("lora_modules_to_save", "fully trained extra modules (embeddings, head) are not modelled")
    top.warn("tokens", "added tokens resize the embedding and the head: not modelled (config vocabulary)")
    experts = top.bool("quantize_moe_experts")  # bitsandbytes parametrize on the fused expert stacks
    if experts is not None:
        top.set("qlora_experts", "quantize_moe_experts", "4bit" if experts else "bf16")


def _step(top: Keys) -> None:
    top.set("batch", "micro_batch_size", top.int("micro_batch_size", lo=1, hi=1 << 20))
    top.set(
        "grad_accum", "gradient_accumulation_steps", top.int("gradient_accumulation_steps", lo=1, hi=1 << 16)
    )
    top.set("seq", "sequence_len", top.int("sequence_len", lo=1, hi=1 << 24))
    ckpt = top.raw("gradient_checkpointing")
    if isinstance(ckpt, str) and ckpt.lower() == "offload":
        top.set("grad_ckpt", "gradient_checkpointing", True)
        top.set("activation_offload", "gradient_checkpointing", True, "activation_offload = True (offload)")
    elif ckpt is not None:
        top.set("grad_ckpt", "gradient_checkpointing", top.bool("gradient_checkpointing"))
    offload = top.raw("activation_offloading")
    if offload not in (None, False):
        top.set("activation_offload", "activation_offloading", True)
    top.note("sample_packing", "packed sequences: each of sequence_len tokens")
    top.note("pad_to_sequence_len", "every batch padded to sequence_len")
    top.set("cp", "context_parallel_size", top.int("context_parallel_size", lo=1, hi=4096))
    top.set("tp", "tensor_parallel_size", top.int("tensor_parallel_size", lo=1, hi=4096))
    top.set("dp", "dp_shard_size", top.int("dp_shard_size", lo=1, hi=4096))
    top.warn("tiled_mlp", "tiled MLP (chunked over the sequence) is not modelled")
    top.set("compile", "torch_compile", top.bool("torch_compile"))


def _precision(top: Keys) -> None:
    bf16 = top.raw("bf16")
    if bf16 is True or (isinstance(bf16, str) and bf16.lower() in ("auto", "true")):
        top.set(
            "precision", "bf16", "bf16", "precision = bf16 (the model is loaded in bf16; auto: a bf16 GPU)"
        )
    elif top.bool("fp16") or top.bool("float16"):
        top.set("precision", "fp16", "amp-fp16", "precision = amp-fp16")
    top.used.update(("fp16", "float16"))
    opt = top.str("optimizer")
    if opt is not None:
        name = HF_OPTIM.get(opt.lower())
        if name is None:
            top.warn("optimizer", "an optimizer gpumem does not model: AdamW is estimated")
        else:
            top.set("optimizer", "optimizer", name)


def _kernels(top: Keys) -> None:
    if top.bool("flash_attention") or top.bool("xformers_attention"):
        top.set("attn", "flash_attention" if top.has("flash_attention") else "xformers_attention", "flash")
    elif top.bool("sdp_attention"):
        top.set("attn", "sdp_attention", "sdpa")
    impl = top.str("attn_implementation")
    if impl is not None:
        top.set(
            "attn",
            "attn_implementation",
            "flash" if "flash" in impl else "eager" if impl == "eager" else "sdpa",
        )
    raw = top.raw("plugins") or []
    if not isinstance(raw, list):  # Axolotl's config schema: a list of plugin class paths
        raise bad("key 'plugins'", f"expected a list of plugin names, got {short(raw)}")
    plugins = [str(p) for p in raw]
    fused = (
        top.bool("liger_fused_linear_cross_entropy")
        or top.bool("cut_cross_entropy")
        or any("CutCrossEntropyPlugin" in p for p in plugins)
    )
    if fused:
        key = "liger_fused_linear_cross_entropy" if top.has("liger_fused_linear_cross_entropy") else "plugins"
        top.set("loss", key, "fused-linear", "loss = fused-linear (Liger / Cut Cross-Entropy)")
        top.warn("chunked_cross_entropy", "the fused linear cross-entropy replaces it; ignored")
    elif top.bool("chunked_cross_entropy"):
        # ModelLoader._apply_chunked_cross_entropy_patch -> patch_chunked_ce_loss_fn(num_chunks or 8)
        top.set(
            "loss", "chunked_cross_entropy", "chunked", "loss = chunked (Axolotl's chunked cross-entropy)"
        )
        top.set(
            "loss_chunks",
            "chunked_cross_entropy_num_chunks",
            top.int("chunked_cross_entropy_num_chunks", lo=1, hi=4096),
        )
    else:
        top.warn("chunked_cross_entropy_num_chunks", "without chunked_cross_entropy; ignored")
    for p in plugins:  # the Liger plugin's kernels are read from their own keys (liger_*)
        if "CutCrossEntropyPlugin" not in p and "LigerPlugin" not in p:
            top.reading.warn(f"plugins: {short(p, 60)}", "a plugin gpumem does not model; ignored")
    for k in _LIGER_OTHER:
        top.warn(k, "Liger's fused norm/rope/GLU kernels are not modelled (the loss is)")
    top.warn("flash_attn_cross_entropy", "flash-attn's cross-entropy is not modelled")


def _sharding(top: Keys) -> None:
    fsdp = top.raw("fsdp")
    version = top.int("fsdp_version", lo=1, hi=2)
    cfg = top.sub("fsdp_config")
    if fsdp or version or cfg is not None:
        parts = fsdp if isinstance(fsdp, list) else str(fsdp or "").split()
        top.set("fsdp", "fsdp" if fsdp else "fsdp_config", "full_shard")
        if "offload" in parts:
            top.set("offload", "fsdp", "optimizer+params")
        top.set("fsdp_version", "fsdp_version", version)
        if cfg is not None:
            fsdp_config(cfg, "")


PARSERS = (AxolotlConfig(),)
