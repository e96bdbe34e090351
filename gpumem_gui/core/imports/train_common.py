"""What the training config readers share: optimizer names (torch classes and the HF Trainer's ``optim``),
LoRA target lists, and DeepSpeed's ``zero_optimization`` block (inline or in a JSON file a config names).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from gpumem_gui.core.errors import short
from gpumem_gui.core.imports.base import Reading
from gpumem_gui.core.imports.keys import Keys

# transformers/training_args.py OptimizerNames -> gpumem optimizer (None: not modelled, warned)
HF_OPTIM: dict[str, str | None] = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_torch_fused": "adamw-fused",
    "adamw_apex_fused": "adamw-fused",
    "adamw_torch_xla": "adamw",
    "adamw_torch_npu_fused": "adamw-fused",
    "adam": "adamw",
    "adamw": "adamw",
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "adam8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw": "paged-adamw-32bit",  # transformers: bnb.optim.PagedAdamW (optim_bits 32)
    "paged_adamw_32bit": "paged-adamw-32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
    "lion_32bit": "lion",
    "lion": "lion",
    "paged_lion_32bit": None,
    "lion_8bit": None,
    "paged_lion_8bit": None,
    "adamw_anyprecision": None,
    "adamw_torch_4bit": None,
    "adamw_torch_8bit": "adamw-8bit",
    "rmsprop": None,
    "adagrad": None,
    "galore_adamw": None,
    "schedule_free_adamw": None,
    "ademamix": None,
    "apollo_adamw": None,
    "muon": None,
}
# torch / bitsandbytes / torchao optimizer classes -> gpumem optimizer
_CLASSES: dict[str, str | None] = {
    "AdamW": "adamw",
    "Adam": "adamw",
    "SGD": "sgd",
    "Adafactor": "adafactor",
    "Lion": "lion",
    "AdamW8bit": "adamw-8bit",
    "Adam8bit": "adamw-8bit",
    "PagedAdamW8bit": "paged-adamw-8bit",
    "PagedAdamW": "paged-adamw-32bit",  # bitsandbytes/optim/adamw.py: Optimizer2State, optim_bits=32
    "PagedAdamW32bit": "paged-adamw-32bit",
    "AdamW4bit": None,
    "AdamWFp8": None,
    "Muon": None,
}


def torch_optimizer(component: str, opt: Keys, r: Reading) -> str | None:
    """The optimizer a ``_component_`` class path builds (``torch.optim.AdamW`` with ``fused: True`` ->
    adamw-fused), or None with a warning naming it."""
    cls = component.rsplit(".", 1)[-1]
    name = _CLASSES.get(cls)
    if name is None:
        r.warn(
            f"{opt.prefix}_component_: {component}", "an optimizer gpumem does not model: AdamW is estimated"
        )
        return None
    if name == "adamw" and cls in ("AdamW", "Adam"):
        if opt.bool("fused"):
            name = "adamw-fused"
        elif opt.bool("foreach") is False:
            name = "adamw-for-loop"
    if name == "sgd" and (opt.float("momentum") or 0) > 0:
        name = "sgd-momentum"
    return name


def hf_optim(keys: Keys, key: str) -> None:
    """The HF Trainer's ``optim`` name at ``key``."""
    value = keys.str(key)
    if value is None:
        return
    name = HF_OPTIM.get(value.lower())
    if name is None:
        keys.warn(key, "an optimizer gpumem does not model: AdamW is estimated")
    else:
        keys.set("optimizer", key, name)


_REGEX_CHARS = "*+?()[]|^$\\"


def lora_targets(keys: Keys, key: str) -> None:
    """A LoRA target list (``[q_proj, v_proj]``, ``"q_proj,v_proj"``, ``all`` / ``all-linear``), or one string
    with regex characters (``.*\\.(q|v)_proj``): PEFT's regex form."""
    value = keys.raw(key)
    if value is None:
        return
    if isinstance(value, str) and value.strip().lower() in ("all", "all-linear", "all_linear"):
        keys.set("lora_targets", key, "all-linear")
        return
    if isinstance(value, str) and any(c in value for c in _REGEX_CHARS):
        # PEFT LoraConfig(target_modules=<one string>): a regex fullmatched against each module's path
        keys.set("lora_targets", key, "re:" + value, f"lora_targets = re:{short(value, 60)} (a regex)")
        return
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise keys.reading.error(keys.where(key), "expected module names (a list, or comma separated)")
    keys.set("lora_targets", key, tuple(value))


# ------------------------------------------------------------------------------------------------ DeepSpeed

_DS_BUCKETS = {
    "reduce_bucket_size": "reduce_bucket",
    "allgather_bucket_size": "allgather_bucket",
    "stage3_prefetch_bucket_size": "prefetch_bucket",
    "stage3_max_live_parameters": "max_live_params",
    "stage3_param_persistence_threshold": "persistence_threshold",
}
_DS_NO_MEMORY = (
    "overlap_comm",
    "contiguous_gradients",
    "sub_group_size",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "round_robin_gradients",
    "allgather_partitions",
    "reduce_scatter",
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "ignore_unused_parameters",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
)


def deepspeed_dict(ds: Keys, r: Reading) -> None:
    """A DeepSpeed config (``zero_optimization``, ``bf16``/``fp16``, micro-batch and accumulation); the
    HF integration's ``"auto"`` leaves a value to the Trainer (printed back as such)."""
    z = ds.sub("zero_optimization")
    if z is not None:
        stage = z.int("stage", lo=0, hi=3)
        z.set("zero", "stage", stage)
        dev = _offload_device(z, "offload_optimizer")
        pdev = _offload_device(z, "offload_param")
        if dev or pdev:
            what = "optimizer+params" if pdev else "optimizer"
            key = "offload_param" if pdev else "offload_optimizer"
            z.set("offload", key, what)
            z.set("offload_device", key, pdev or dev)
        for key, field in _DS_BUCKETS.items():
            value = z.raw(key)
            if isinstance(value, str) and value.lower() == "auto":
                z.note(key, "auto: the HF integration sets it from the model's hidden size")
            elif value is not None:
                z.set(field, key, z.int(key, lo=0, hi=(1 << 31) - 1))
        z.no_memory(_DS_NO_MEMORY)
        z.rest()
    _ds_optimizer(ds)
    for flag, precision in (("bf16", "bf16"), ("fp16", "amp-fp16")):
        sub = ds.data.get(flag)
        if isinstance(sub, Mapping):
            k = Keys(sub, r, f"{flag}.")
            if k.bool("enabled"):
                value = "amp-bf16" if flag == "bf16" else precision
                ds.set("precision", flag, value)
                if flag == "bf16":
                    r.warn(
                        ds.written(flag),
                        "DeepSpeed bf16 keeps bf16 weights beside the fp32 master copy; gpumem's nearest is "
                        "amp-bf16 (fp32 weights, gradients and states)",
                    )
            k.no_memory(
                ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")
            )
            k.rest()
        ds.used.add(flag)
    for key, field in (
        ("train_micro_batch_size_per_gpu", "batch"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        value = ds.raw(key)
        if isinstance(value, str) and value.lower() == "auto":
            ds.note(key, "auto: the Trainer's value")
        elif value is not None:
            ds.set(field, key, ds.int(key, lo=1, hi=1 << 20))
    ds.note("gradient_clipping", "no effect on memory (clips in place)")
    ds.no_memory(
        (
            "train_batch_size",
            "steps_per_print",
            "wall_clock_breakdown",
            "zero_allow_untested_optimizer",
            "scheduler",
            "flops_profiler",
            "tensorboard",
            "wandb",
            "comms_logger",
            "prescale_gradients",
            "communication_data_type",
            "seq_parallel_communication_data_type",
            "dump_state",
            "checkpoint",
        )
    )
    ds.rest()


def _offload_device(z: Keys, key: str) -> str | None:
    sub = z.sub(key)
    if sub is None:
        return None
    device = (sub.str("device") or "none").lower()
    sub.no_memory(
        ("pin_memory", "buffer_count", "buffer_size", "fast_init", "ratio", "nvme_path", "max_in_cpu")
    )
    sub.rest()
    if device in ("cpu", "nvme"):
        return device
    if device != "none":
        raise z.reading.error(
            sub.where("device"), f"{device!r} is not a DeepSpeed offload device (cpu, nvme, none)"
        )
    return None


def deepspeed_reference(keys: Keys, key: str, path: str) -> None:
    """A ``deepspeed:`` setting: a JSON file (read when found next to the config or under the working
    directory) or an inline mapping."""
    value = keys.raw(key)
    r = keys.reading
    if value is None:
        return
    if isinstance(value, Mapping):
        deepspeed_dict(Keys(value, r, f"{keys.prefix}{key}."), r)
        return
    if not isinstance(value, str):
        raise r.error(keys.where(key), "expected the path of a DeepSpeed JSON file")
    r.fields.setdefault("framework", "deepspeed")
    for base in (os.path.dirname(path), os.getcwd()):
        candidate = os.path.join(base, value)
        if os.path.isfile(candidate) and os.path.getsize(candidate) < 1_000_000:
            try:
                with open(candidate, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError, RecursionError):
                raise r.error(keys.where(key), f"{value}: not a readable DeepSpeed JSON file") from None
            if not isinstance(data, Mapping):
                raise r.error(keys.where(key), f"{value}: expected a JSON object")
            r.note(keys.written(key), f"DeepSpeed config read from {candidate}")
            deepspeed_dict(Keys(data, r, f"{os.path.basename(value)}:"), r)
            return
    _deepspeed_by_name(keys, key, value)


_STAGE_NAMES = ("z", "zero", "zero_", "stage", "stage_")


def _deepspeed_by_name(keys: Keys, key: str, value: str) -> None:
    """The file is not here: the ZeRO stage and offload from its name (``zero3_bf16.json``, ``ds_z3_offload_
    config.json``), said so; the rest of the file is unknown."""
    name = os.path.basename(value).lower()
    stage = next((s for s in (3, 2, 1) if any(f"{p}{s}" in name for p in _STAGE_NAMES)), None)
    if stage is None:
        keys.warn(key, "the DeepSpeed file is not here and its name gives no ZeRO stage: give --zero")
        return
    keys.set("zero", key, stage, f"zero = {stage} (from the file name; the file is not here)")
    if "offload" in name:
        keys.set(
            "offload", key, "optimizer+params" if stage == 3 else "optimizer", "offload (from the file name)"
        )
    keys.reading.warn(
        keys.written(key), "the DeepSpeed file was not found: buckets and precision are defaults"
    )


def _ds_optimizer(ds: Keys) -> None:
    """The config's own ``optimizer`` section: DeepSpeed builds it (and the HF integration then makes none:
    transformers integrations/deepspeed.py ``deepspeed_optim_sched``). Adam / AdamW: DeepSpeed's FusedAdam,
    one multi-tensor kernel with no step temporaries, unless ``params.torch_adam`` asks for torch's AdamW
    (deepspeed/runtime/engine.py ``DeepSpeedEngine._configure_basic_optimizer``; with the optimizer offloaded
    DeepSpeedCPUAdam steps on the CPU)."""
    opt = ds.sub("optimizer")
    if opt is None:
        return
    kind = (opt.str("type") or "").lower()
    params = opt.sub("params")
    torch_adam = params.bool("torch_adam") if params is not None else None
    if kind in ("adam", "adamw"):
        name, how = ("adamw", "torch.optim.AdamW") if torch_adam else ("adamw-fused", "DeepSpeed FusedAdam")
        opt.set("optimizer", "type", name, f"optimizer = {name} ({how})")
    else:
        opt.warn("type", "an optimizer gpumem does not model: AdamW is estimated")
    if params is not None:
        params.no_memory(("lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction"))
        params.rest()
    opt.rest()
