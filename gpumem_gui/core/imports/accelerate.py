"""accelerate config YAML files (``accelerate config`` / ``accelerate launch --config_file``:
``distributed_type``, ``num_processes``, ``mixed_precision``, ``fsdp_config``, ``deepspeed_config``),
read as a
:class:`TrainingRun`. Keys as ``accelerate/commands/config/config_args.py`` (``ClusterConfig``) and
``accelerate/utils/dataclasses.py`` (``FullyShardedDataParallelPlugin``: ``fsdp_version`` 1 by default,
``DeepSpeedPlugin``) declare them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading
from gpumem_gui.core.imports.hf_args import fsdp_config
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import deepspeed_reference

_NO_MEMORY = (
    "compute_environment",
    "debug",
    "downcast_bf16",
    "enable_cpu_affinity",
    "gpu_ids",
    "machine_rank",
    "main_training_function",
    "num_machines",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
    "main_process_ip",
    "main_process_port",
    "dynamo_config",
)
_DS_NO_MEMORY = ("zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher")


class AccelerateConfig:
    name = "accelerate config"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        return "distributed_type" in data or "compute_environment" in data

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("accelerate config", file=path)
        top = Keys(data, r)
        kind = (top.str("distributed_type") or "NO").upper()
        n = top.int("num_processes", lo=1, hi=1 << 20)
        if n is not None:
            top.set("dp", "num_processes", n, f"dp = {n} (one process per GPU)")
        mp = (top.str("mixed_precision") or "no").lower()
        if kind == "FSDP":
            r.fields["fsdp"] = "full_shard"  # FullyShardedDataParallelPlugin's default sharding strategy
            r.fields["fsdp_version"] = 1  # accelerate's default fsdp_version
            top.note("distributed_type", "fsdp = full_shard, fsdp_version = 1 (accelerate's defaults)")
            sub = top.sub("fsdp_config")
            if sub is not None:
                fsdp_config(sub, "")
            if mp == "bf16":
                top.set(
                    "precision", "mixed_precision", "mp-bf16", "precision = mp-bf16 (FSDP MixedPrecision)"
                )
        elif kind == "DEEPSPEED":
            r.fields["framework"] = "deepspeed"
            _deepspeed(top, r, path)
        elif kind not in ("NO", "MULTI_GPU"):
            top.warn(
                "distributed_type",
                "a distributed type gpumem does not model (NO, MULTI_GPU, FSDP, DEEPSPEED)",
            )
        if mp in ("bf16", "fp16") and "precision" not in r.fields:
            top.set(
                "precision", "mixed_precision", f"amp-{mp}", f"precision = amp-{mp} (fp32 weights, autocast)"
            )
        elif mp == "fp8":
            top.set("float8", "mixed_precision", True, "float8 = True (accelerate fp8 recipe)")
        top.used.add("mixed_precision")
        top.no_memory(_NO_MEMORY)
        top.rest()
        r.missing_model("model", "an accelerate config names none")
        return r.training(None)


def _deepspeed(top: Keys, r: Reading, path: str) -> None:
    ds = top.sub("deepspeed_config")
    if ds is None:
        return
    if ds.has("deepspeed_config_file"):
        deepspeed_reference(ds, "deepspeed_config_file", path)
    stage = ds.int("zero_stage", lo=0, hi=3)
    ds.set("zero", "zero_stage", stage)
    opt = (ds.str("offload_optimizer_device") or "none").lower()
    par = (ds.str("offload_param_device") or "none").lower()
    if par in ("cpu", "nvme"):
        ds.set("offload", "offload_param_device", "optimizer+params")
        ds.set("offload_device", "offload_param_device", par)
    elif opt in ("cpu", "nvme"):
        ds.set("offload", "offload_optimizer_device", "optimizer")
        ds.set("offload_device", "offload_optimizer_device", opt)
    ds.set(
        "grad_accum", "gradient_accumulation_steps", ds.int("gradient_accumulation_steps", lo=1, hi=1 << 16)
    )
    ds.note("gradient_clipping", "no effect on memory")
    ds.no_memory(_DS_NO_MEMORY)
    ds.rest()


PARSERS = (AccelerateConfig(),)
