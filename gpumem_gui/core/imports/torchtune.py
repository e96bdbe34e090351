"""torchtune recipe configs (``recipes/configs/<model>/<size>_<method>[_single_device].yaml``), read as a
:class:`TrainingRun` with framework ``torchtune``.

Keys as the recipes read them (``recipes/full_finetune_single_device.py``, ``lora_finetune_distributed.py``
and the others, torchtune bd2a0fc): ``model._component_`` names the builder (``lora_`` / ``qlora_`` prefixes,
``lora_attn_modules``, ``apply_lora_to_mlp``, ``apply_lora_to_output``, ``lora_rank``, ``lora_alpha``,
``quantize_base``), ``batch_size``, ``gradient_accumulation_steps``, ``enable_activation_checkpointing``,
``enable_activation_offloading``, ``optimizer_in_bwd``, ``compile``, ``loss._component_``, ``dtype``,
``fsdp_cpu_offload``, ``tokenizer.max_seq_len``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import torch_optimizer

# torchtune builder (without lora_/qlora_ and _instruct/_base) -> the Hub model it builds (same architecture;
# the catalog's id where it has one)
_MODELS = {
    "gemma_2b": "google/gemma-2b",
    "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b",
    "gemma2_9b": "google/gemma-2-9b",
    "gemma2_27b": "google/gemma-2-27b",
    "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B",
    "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi4_14b": "microsoft/phi-4",
    "qwen2_0_5b": "Qwen/Qwen2-0.5B",
    "qwen2_1_5b": "Qwen/Qwen2-1.5B",
    "qwen2_7b": "Qwen/Qwen2-7B",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B",
    "qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_3b": "Qwen/Qwen2.5-3B",
    "qwen2_5_7b": "Qwen/Qwen2.5-7B",
    "qwen2_5_14b": "Qwen/Qwen2.5-14B",
    "qwen2_5_32b": "Qwen/Qwen2.5-32B",
    "qwen2_5_72b": "Qwen/Qwen2.5-72B",
    "qwen3_0_6b": "Qwen/Qwen3-0.6B",
    "qwen3_1_7b": "Qwen/Qwen3-1.7B",
    "qwen3_4b": "Qwen/Qwen3-4B",
    "qwen3_8b": "Qwen/Qwen3-8B",
    "qwen3_14b": "Qwen/Qwen3-14B",
    "qwen3_32b": "Qwen/Qwen3-32B",
    "llama4_scout_17b_16e": "meta-llama/Llama-4-Scout-17B-16E",
    "llama4_maverick_17b_128e": "meta-llama/Llama-4-Maverick-17B-128E",
}
# torchtune module names -> Hugging Face names (torchtune/models/convert_weights.py)
_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_MLP = ("gate_proj", "up_proj", "down_proj")  # torchtune w1, w3, w2
_LOSSES = {
    "LinearCrossEntropyLoss": "chunked",
    "CEWithChunkedOutputLoss": "chunked-output",  # v0.3 to v0.5 (training/profile_table.py torchtune)
    "CrossEntropyLoss": "standard",
}
_NO_MEMORY = (
    "output_dir",
    "tokenizer",
    "checkpointer",
    "resume_from_checkpoint",
    "save_adapter_weights_only",
    "dataset",
    "dataset_val",
    "seed",
    "shuffle",
    "lr_scheduler",
    "epochs",
    "max_steps_per_epoch",
    "clip_grad_norm",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "log_level",
    "device",
    "profiler",
    "run_val_every_n_steps",
    "batch_size_val",
    "custom_sharded_layers",
    "fsdp_reshard_after_forward",
    "log_grad_norm",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "cudnn_deterministic_mode",
    "collate_fn",
    "resume_from_checkpoint_dir",
    "checkpoint_dir",
    "quantizer",
)
_DISTRIBUTED_KEYS = (
    "fsdp_cpu_offload",
    "custom_sharded_layers",
    "fsdp_reshard_after_forward",
    "tensor_parallel_dim",
)


# `tune run [--nproc_per_node N] RECIPE --config ...` in a recipe config's header comment
_TUNE_RUN = re.compile(r"tune run (?:--\S+ \S+ )*([a-z][a-z0-9_]*)")


class TorchtuneRecipe:
    name = "torchtune recipe"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        model = data.get("model")
        return isinstance(model, Mapping) and str(model.get("_component_", "")).startswith(
            "torchtune.models."
        )

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("torchtune recipe", file=path)
        r.fields["framework"] = "torchtune"
        top = Keys(data, r)
        model = _model(top, r)
        _step(top, r)
        _precision_and_optimizer(top, r)
        _sharding(top, r, path)
        top.no_memory(_NO_MEMORY)
        top.rest()
        return r.training(model)


def _model(top: Keys, r: Reading) -> str | None:
    m = top.sub("model")
    assert m is not None  # matches() checked it
    component = str(m.raw("_component_"))
    builder = component.rsplit(".", 1)[-1]
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
    if m.bool("quantize_base"):
        method = "qlora"
    m.set("method", "_component_", method, f"method = {method} (builder {builder})")
    hub = _MODELS.get(base.removesuffix("_instruct").removesuffix("_base"))
    if method != "full":
        _lora(m)
    dropout = m.float("lora_dropout", lo=0, hi=0.999)
    m.set("lora_dropout", "lora_dropout", dropout)
    m.rest("a builder argument gpumem does not model; ignored")
    if hub is None:
        r.missing_model(f"model._component_: {component}", "a torchtune model gpumem has no Hub id for")
        return None
    r.note(f"model._component_: {component}", f"model {hub}")
    return hub


def _lora(m: Keys) -> None:
    m.set("lora_rank", "lora_rank", m.int("lora_rank", lo=1, hi=1 << 16))
    m.set("lora_alpha", "lora_alpha", m.float("lora_alpha", lo=1e-9, hi=1 << 20))
    attn = m.raw("lora_attn_modules", [])
    if not isinstance(attn, list) or not all(isinstance(a, str) for a in attn):
        raise m.reading.error(m.where("lora_attn_modules"), "expected a list of module names")
    targets = [_ATTN.get(a, a) for a in attn]
    if m.bool("apply_lora_to_mlp"):
        targets += _MLP
    if m.bool("apply_lora_to_output"):
        targets.append("lm_head")
    if targets:
        m.set("lora_targets", "lora_attn_modules", tuple(targets), f"lora_targets = {','.join(targets)}")


def _step(top: Keys, r: Reading) -> None:
    top.set("batch", "batch_size", top.int("batch_size", lo=1, hi=1 << 20))
    top.set("grad_accum", "gradient_accumulation_steps", top.int("gradient_accumulation_steps", lo=1))
    top.set("grad_ckpt", "enable_activation_checkpointing", top.bool("enable_activation_checkpointing"))
    top.set("activation_offload", "enable_activation_offloading", top.bool("enable_activation_offloading"))
    top.set("optimizer_in_backward", "optimizer_in_bwd", top.bool("optimizer_in_bwd"))
    compile_ = top.raw("compile")
    if compile_ is not None:
        on = bool(compile_) if isinstance(compile_, Mapping) else top.bool("compile")
        top.set("compile", "compile", on)
    tok = top.data.get("tokenizer")
    seq = tok.get("max_seq_len") if isinstance(tok, Mapping) else None
    if seq is not None:
        t = Keys(tok, r, "tokenizer.")
        t.set("seq", "max_seq_len", t.int("max_seq_len", lo=1, hi=1 << 24))
    else:
        r.warn(
            "tokenizer.max_seq_len: null", "sequences as long as the data's: gpumem estimates --seq (2048)"
        )
    loss = top.sub("loss")
    if loss is not None:
        name = str(loss.raw("_component_", "")).rsplit(".", 1)[-1]
        if name not in _LOSSES:
            r.warn(f"loss._component_: {name}", "a loss gpumem does not know; the framework default is used")
        else:
            loss.set("loss", "_component_", _LOSSES[name])
        loss.set("loss_chunks", "num_output_chunks", loss.int("num_output_chunks", lo=1, hi=4096))
        loss.rest()


def _precision_and_optimizer(top: Keys, r: Reading) -> None:
    dtype = top.str("dtype")
    if dtype is not None:
        precision = {"bf16": "bf16", "fp32": "fp32"}.get(dtype.lower())
        if precision is None:
            raise r.error(top.where("dtype"), f"{dtype!r}: torchtune trains in bf16 or fp32")
        top.set("precision", "dtype", precision)
    opt = top.sub("optimizer")
    if opt is not None:
        component = str(opt.raw("_component_", ""))
        name = torch_optimizer(component, opt, r)
        if name is not None:
            opt.set("optimizer", "_component_", name)
        opt.no_memory(
            ("lr", "weight_decay", "betas", "eps", "amsgrad", "lr_scheduler"), "no effect on memory"
        )
        opt.rest()


def _recipe(path: str) -> tuple[str | None, int | None]:
    """The recipe the config's own comment names (``tune run --nproc_per_node 4 full_finetune_distributed
    --config ...``) and the GPU count given there."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(20_000)
    except (OSError, UnicodeDecodeError):
        return None, None
    m = _TUNE_RUN.search(head)
    if m is None:
        return None, None
    n = re.search(r"--nproc_per_node[ =](\d{1,4})\b", m.group(0))
    return m.group(1), int(n.group(1)) if n else None


def _sharding(top: Keys, r: Reading, path: str) -> None:
    recipe, nproc = _recipe(path)
    if recipe is not None:
        r.note(f"# tune run {recipe}", f"recipe {recipe} (named in the config's comment)")
        distributed = "distributed" in recipe or any(k in top.data for k in _DISTRIBUTED_KEYS)
        if distributed and nproc:
            r.set(
                "dp", nproc, "the config's comment", f"# tune run --nproc_per_node {nproc}", f"dp = {nproc}"
            )
    else:
        distributed = any(k in top.data for k in _DISTRIBUTED_KEYS) or (
            "single_device" not in os.path.basename(path) and _multi_device_name(path)
        )
    if top.has("tensor_parallel_dim"):
        top.set("tp", "tensor_parallel_dim", top.int("tensor_parallel_dim", lo=1, hi=4096))
    if top.bool("fsdp_cpu_offload"):
        top.set(
            "offload",
            "fsdp_cpu_offload",
            "optimizer+params",
            "offload = optimizer+params (FSDP2 CPUOffloadPolicy)",
        )
    if distributed:
        r.fields["fsdp"] = "full_shard"
        r.note("a distributed recipe", "fsdp = full_shard (FSDP2 fully_shard in every distributed recipe)")
        if "dp" not in r.fields:
            r.warn("GPUs", "the GPU count comes from `tune run --nproc_per_node`: give --dp (gpumem: dp 1)")


def _multi_device_name(path: str) -> bool:
    """torchtune's configs name single-device recipes ``*_single_device.yaml``; the others are distributed."""
    name = os.path.basename(path).lower()
    return name.endswith((".yaml", ".yml")) and any(m in name for m in ("_full", "_lora", "_qlora", "_dpo"))


PARSERS = (TorchtuneRecipe(),)
