"""torchtitan train configs (TOML, ``torchtitan/models/<model>/train_configs/*.toml`` up to 2026-02, then
Python; the TOML sections stay the job config's: ``[model]``, ``[training]``, ``[parallelism]``,
``[activation_checkpoint]``, ``[compile]``, ``[float8]`` / ``model.converters``, ``[optimizer]``), read as a
:class:`TrainingRun` with framework ``torchtitan``. Keys as ``torchtitan/config/job_config.py`` declares them;
FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (``training.mixed_precision_param``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading
from gpumem_gui.core.imports.keys import Keys

# [model] name / flavor -> the Hub model of the same architecture (the catalog's id where it has one)
_MODELS = {
    ("llama3", "8B"): "meta-llama/Llama-3.1-8B",
    ("llama3", "70B"): "meta-llama/Llama-3.1-70B-Instruct",
    ("llama3", "405B"): "meta-llama/Llama-3.1-405B",
    ("qwen3", "0.6B"): "Qwen/Qwen3-0.6B",
    ("qwen3", "1.7B"): "Qwen/Qwen3-1.7B",
    ("qwen3", "4B"): "Qwen/Qwen3-4B",
    ("qwen3", "8B"): "Qwen/Qwen3-8B",
    ("qwen3", "14B"): "Qwen/Qwen3-14B",
    ("qwen3", "32B"): "Qwen/Qwen3-32B",
    ("deepseek_v3", "671B"): "deepseek-ai/DeepSeek-V3",
}
_SECTIONS_NO_MEMORY = (
    "job",
    "profiling",
    "metrics",
    "lr_scheduler",
    "checkpoint",
    "validation",
    "comm",
    "fault_tolerance",
    "experimental",
    "memory_estimation",
    "quantize",
)
_SCHEDULES = {
    "1f1b": "1f1b",
    "gpipe": "gpipe",
    "interleaved1f1b": "interleaved-1f1b",
    "zbvzerobubble": "zero-bubble",
    "interleavedzerobubble": "zero-bubble",
}
_IMPL = {"fused": "adamw-fused", "foreach": "adamw-foreach", "for-loop": "adamw-for-loop"}


class TorchtitanConfig:
    name = "torchtitan config"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        model = data.get("model")
        return (
            isinstance(model, Mapping)
            and "flavor" in model
            and ("training" in data or "parallelism" in data or "job" in data)
        )

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("torchtitan config", file=path)
        r.fields["framework"] = "torchtitan"
        r.fields["precision"] = "mp-bf16"
        top = Keys(data, r)
        model = _model(top, r)
        _training(top, r)
        _parallelism(top, r)
        _checkpointing(top)
        top.no_memory(_SECTIONS_NO_MEMORY, "no effect on GPU memory (whole section)")
        top.rest()
        return r.training(model)


def _model(top: Keys, r: Reading) -> str | None:
    m = top.sub("model")
    assert m is not None
    name, flavor = m.str("name") or "", m.str("flavor") or ""
    converters = m.raw("converters", [])
    if isinstance(converters, list) and "float8" in converters:
        m.set("float8", "converters", True)
    assets = m.str("hf_assets_path") or m.str("tokenizer_path")
    m.no_memory(("hf_assets_path", "tokenizer_path", "print_after_conversion"), "read for the model name")
    m.rest()
    hub = _MODELS.get((name, flavor))
    if hub is None and assets:
        hub = _from_assets(assets)
    if hub is None:
        r.missing_model(f"model.name/flavor: {name} {flavor}", "a torchtitan model gpumem has no Hub id for")
        return None
    r.note(f"model: {name} {flavor}", f"model {hub}")
    return hub


def _from_assets(path: str) -> str | None:
    base = os.path.basename(path.rstrip("/"))
    known = {hub.split("/")[-1].lower(): hub for hub in _MODELS.values()}
    return known.get(base.lower())


def _training(top: Keys, r: Reading) -> None:
    t = top.sub("training")
    if t is None:
        return
    batch = t.int("local_batch_size", lo=1, hi=1 << 20) or t.int("batch_size", lo=1, hi=1 << 20)
    key = "local_batch_size" if t.has("local_batch_size") else "batch_size"
    t.set("batch", key, batch)
    t.set("seq", "seq_len", t.int("seq_len", lo=1, hi=1 << 24))
    mp = (t.str("mixed_precision_param") or "bfloat16").lower()
    if mp == "float32":
        t.set("precision", "mixed_precision_param", "fp32")
    t.set("compile", "compile", t.bool("compile"))
    t.note(
        "global_batch_size",
        "the accumulation it implies depends on the data-parallel degree: give --grad-accum",
    )
    t.no_memory(
        (
            "steps",
            "max_norm",
            "dataset",
            "dataset_path",
            "warmup_steps",
            "mixed_precision_reduce",
            "gc_freq",
            "seed",
            "deterministic",
            "enable_cpu_offload",
            "dataloader",
        )
    )
    t.warn("enable_cpu_offload", "FSDP2 CPU offload is not modelled here: give --offload optimizer+params")
    t.rest()
    opt = top.sub("optimizer")
    if opt is not None:
        name = (opt.str("name") or "AdamW").lower()
        impl = (opt.str("implementation") or "fused").lower()
        if name in ("adamw", "adam"):
            value = _IMPL.get(impl, "adamw")
            how = "" if opt.has("implementation") else " (torchtitan's default implementation, fused)"
            opt.set("optimizer", "implementation", value, f"optimizer = {value}{how}")
        else:
            opt.warn("name", "an optimizer gpumem does not model: AdamW is estimated")
        opt.no_memory(("lr", "eps", "weight_decay", "beta1", "beta2", "early_step_in_backward"))
        opt.rest()
    comp = top.sub("compile")
    if comp is not None:
        comp.set("compile", "enable", comp.bool("enable"))
        parts = comp.raw("components")  # CompileConfig.components, default ["model", "loss"]
        if isinstance(parts, list) and "loss" not in parts:
            comp.set("compile_loss", "components", "off")  # components/loss.py: no torch.compile(loss_fn)
        comp.no_memory(("backend",))
        comp.rest()
    f8 = top.sub("float8")
    if f8 is not None:
        f8.no_memory(
            (
                "enable_fsdp_float8_all_gather",
                "precompute_float8_dynamic_scale_for_fsdp",
                "filter_fqns",
                "recipe_name",
                "emulate",
            ),
            "float8 settings (float8 on via model.converters)",
        )
        f8.rest()


def _parallelism(top: Keys, r: Reading) -> None:
    p = top.sub("parallelism")
    if p is None:
        return
    shard = p.int("data_parallel_shard_degree", lo=-1, hi=4096)
    replicate = p.int("data_parallel_replicate_degree", lo=1, hi=4096) or 1
    if shard == -1:
        r.fields["fsdp"] = "full_shard"
        p.note("data_parallel_shard_degree", "fsdp = full_shard over the GPUs left (-1)")
        r.warn(p.written("data_parallel_shard_degree"), "the GPU count is the launcher's: give --dp")
    elif shard is not None and shard > 0:
        p.set("dp", "data_parallel_shard_degree", shard * replicate)
        if shard > 1:
            r.fields["fsdp"] = "hybrid_shard" if replicate > 1 else "full_shard"
    if replicate > 1 and shard not in (None, -1):
        r.fields["gpus_per_node"] = shard
    p.set("tp", "tensor_parallel_degree", p.int("tensor_parallel_degree", lo=1, hi=4096))
    p.set("pp", "pipeline_parallel_degree", p.int("pipeline_parallel_degree", lo=1, hi=4096))
    p.set("cp", "context_parallel_degree", p.int("context_parallel_degree", lo=1, hi=4096))
    p.set("ep", "expert_parallel_degree", p.int("expert_parallel_degree", lo=1, hi=4096))
    if (r.fields.get("tp") or 1) > 1:
        r.fields["sequence_parallel"] = True
        r.note(
            "parallelism.tensor_parallel_degree",
            "sequence_parallel = True (torchtitan's TP plan shards norms)",
        )
    sched = p.str("pipeline_parallel_schedule")
    if sched is not None:
        value = _SCHEDULES.get(sched.lower())
        if value is None:
            p.warn(
                "pipeline_parallel_schedule", "a pipeline schedule gpumem does not model: 1F1B is estimated"
            )
        else:
            p.set("pp_schedule", "pipeline_parallel_schedule", value)
    reshard = (p.str("fsdp_reshard_after_forward") or "default").lower()
    if reshard == "never" and r.fields.get("fsdp"):
        p.set("fsdp", "fsdp_reshard_after_forward", "shard_grad_op")
    p.no_memory(
        (
            "enable_async_tensor_parallel",
            "disable_loss_parallel",
            "enable_compiled_autograd",
            "pipeline_parallel_microbatch_size",
            "pipeline_parallel_split_points",
            "context_parallel_rotate_method",
            "data_parallel_replicate_degree",
            "pipeline_parallel_layers_per_stage",
            "module_fqns_per_model_part",
            "expert_tensor_parallel_degree",
        )
    )
    p.rest()


def _checkpointing(top: Keys) -> None:
    ac = top.sub("activation_checkpoint")
    if ac is None:
        return
    mode = (ac.str("mode") or "selective").lower()
    if mode == "none":
        ac.set("grad_ckpt", "mode", False)
        return
    ac.set("grad_ckpt", "mode", True)
    option = ac.str("selective_ac_option") if mode == "selective" else None
    if option is not None and option.lower() == "op":
        ac.set("ckpt_policy", "selective_ac_option", "selective-op")
    elif option is not None:
        ac.set("ckpt_every", "selective_ac_option", ac.int("selective_ac_option", lo=1, hi=4096))
    ac.used.add("selective_ac_option")
    ac.no_memory(
        (
            "per_op_sac_force_recompute_mm_shapes_by_fqns",
            "early_stop",
            "memory_budget",
            "visualize_memory_budget_pareto",
        )
    )
    ac.rest()


PARSERS = (TorchtitanConfig(),)
