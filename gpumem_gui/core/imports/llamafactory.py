"""LLaMA-Factory training YAML files (``examples/train_lora/*.yaml``, ``llamafactory-cli train x.yaml``), read
as a :class:`TrainingRun` with framework ``llama-factory``. Keys as ``src/llamafactory/hparams``
(``ModelArguments``: ``quantization_bit``, ``double_quantization`` = True, ``flash_attn``,
``enable_liger_kernel``;
``FinetuningArguments``: ``finetuning_type``, ``lora_rank`` = 8, ``lora_alpha`` = 2 x rank, ``lora_target``,
``pure_bf16``, ``disable_gradient_checkpointing`` = False, so checkpointing is on by default;
``DataArguments``:
``cutoff_len`` = 2048) plus the ``TrainingArguments`` fields declare them. Full fine-tuning upcasts the
trainable
weights to fp32 unless ``pure_bf16`` (``llamafactory/model/adapter.py``, ``cast_trainable_params_to_fp32``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading, words
from gpumem_gui.core.imports.hf_args import TRAINER_NO_MEMORY, trainer_keys
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import lora_targets

_NO_MEMORY = words(
    "stage do_train dataset eval_dataset template max_samples overwrite_cache preprocessing_num_workers "
    "plot_loss ddp_timeout val_size per_device_eval_batch_size quantization_method quantization_type "
    "trust_remote_code dataset_dir media_dir tokenized_path mix_strategy interleave_probs streaming "
    "buffer_size "
    "packing neat_packing tool_format image_max_pixels video_max_pixels enable_thinking default_system "
    "infer_backend export_dir adapter_name_or_path create_new_adapter"
)
_ATTN = {"fa2": "flash", "fa3": "flash", "sdpa": "sdpa", "disabled": "eager", "eager": "eager"}


class LlamaFactoryConfig:
    name = "LLaMA-Factory config"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        return "model_name_or_path" in data and any(
            k in data for k in ("finetuning_type", "stage", "cutoff_len", "template", "lora_target")
        )

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("LLaMA-Factory config", file=path)
        r.fields["framework"] = "llama-factory"
        top = Keys(data, r)
        model = top.str("model_name_or_path")
        top.note("model_name_or_path", "model")
        _method(top)
        trainer_keys(top, r, path)
        r.fields["framework"] = "llama-factory"  # a deepspeed file does not change who runs the training
        if top.bool("pure_bf16"):
            top.set("precision", "pure_bf16", "bf16", "precision = bf16 (pure_bf16: no fp32 copy)")
        seq = top.int("cutoff_len", lo=1, hi=1 << 24)
        top.set(
            "seq",
            "cutoff_len",
            seq if seq is not None else 2048,
            None if seq else "seq = 2048 (cutoff_len default)",
        )
        if top.bool("disable_gradient_checkpointing"):
            top.set("grad_ckpt", "disable_gradient_checkpointing", False)
        else:
            r.fields["grad_ckpt"] = True
            r.note("disable_gradient_checkpointing (not set)", "grad_ckpt = True (LLaMA-Factory's default)")
        if top.bool("enable_liger_kernel"):
            top.set("loss", "enable_liger_kernel", "fused-linear", "loss = fused-linear (Liger)")
        attn = top.str("flash_attn")
        if attn is not None and attn.lower() in _ATTN:
            top.set("attn", "flash_attn", _ATTN[attn.lower()])
        _vision_tower(top, r)
        top.warn("use_unsloth", "unsloth's kernels are not applied (give --framework unsloth)")
        top.warn("use_unsloth_gc", "unsloth's offloaded checkpointing is not applied")
        top.no_memory(_NO_MEMORY + TRAINER_NO_MEMORY)
        top.rest()
        return r.training(model)


def _vision_tower(top: Keys, r: Reading) -> None:
    """FinetuningArguments.freeze_vision_tower (default true): false trains the tower in a full fine-tune
    (train_vision_tower). With LoRA it decides how far the targets reach (lora_vision_tower):
    model/model_utils/misc.py find_all_linear_modules leaves a composite model's projector (projector_key)
    out of ``lora_target: all`` always and its tower (vision_model_keys) while freeze_vision_tower holds;
    model/model_utils/visual.py patch_target_modules filters a named target list the same way, the
    projector by freeze_multi_modal_projector (default true)."""
    frozen = top.bool("freeze_vision_tower") is not False
    if r.fields.get("method") == "full":
        if frozen:
            top.note("freeze_vision_tower", "the vision tower frozen (LLaMA-Factory's default)")
        else:
            top.set("train_vision_tower", "freeze_vision_tower", True, "train_vision_tower = on")
        return
    top.note("freeze_multi_modal_projector", "the projector left out of the LoRA targets unless false")
    if frozen:
        r.fields["lora_vision_tower"] = "excluded"
        r.note(
            top.written("freeze_vision_tower") if top.has("freeze_vision_tower") else "freeze_vision_tower",
            "lora_vision_tower = excluded (LLaMA-Factory leaves the vision tower and projector out of the "
            "LoRA targets)",
        )
        return
    every = (top.str("lora_target") or "all").strip().lower() == "all"
    reach = "tower" if every or top.bool("freeze_multi_modal_projector") is not False else "targets"
    top.set("lora_vision_tower", "freeze_vision_tower", reach, f"lora_vision_tower = {reach}")


def _method(top: Keys) -> None:
    kind = (top.str("finetuning_type") or "lora").lower()
    bits = top.int("quantization_bit", lo=1, hi=16)
    if kind == "lora":
        # llamafactory/model/model_utils/quantization.py: quantization_bit 8 or 4 with the default
        # quantization_method bitsandbytes: BitsAndBytesConfig(load_in_8bit=True) / (load_in_4bit=True, nf4)
        method = "qlora" if bits in (4, 8) else "lora"
        top.set("method", "quantization_bit" if method == "qlora" else "finetuning_type", method)
        if bits == 8:
            top.set("qlora_base", "quantization_bit", "int8", "qlora_base = int8 (bitsandbytes load_in_8bit)")
        elif bits is not None and bits != 4:
            top.warn("quantization_bit", "only 4- and 8-bit bitsandbytes bases are modelled: a 16-bit base")
            bits = None
        rank = top.int("lora_rank", lo=1, hi=1 << 16) or 8
        top.set("lora_rank", "lora_rank", rank, None if top.has("lora_rank") else "lora_rank = 8 (default)")
        alpha = top.float("lora_alpha", lo=1e-9, hi=1 << 20)
        top.set("lora_alpha", "lora_alpha", alpha if alpha is not None else 2 * rank)
        top.set("lora_dropout", "lora_dropout", top.float("lora_dropout", lo=0, hi=0.999))
        lora_targets(top, "lora_target")
        if bits == 4 and top.bool("double_quantization") is not False:
            top.set(
                "qlora_base",
                "quantization_bit",
                "nf4-dq",
                "qlora_base = nf4-dq (double_quantization default)",
            )
        top.used.add("double_quantization")
    elif kind == "full":
        top.set("method", "finetuning_type", "full")
    else:
        top.warn(
            "finetuning_type", "a fine-tuning type gpumem does not model (lora, full): full is estimated"
        )
    if bits is not None and kind != "lora":
        top.warn(
            "quantization_bit", "a quantized base is modelled under LoRA only (4- or 8-bit bitsandbytes)"
        )


PARSERS = (LlamaFactoryConfig(),)
