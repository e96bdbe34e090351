"""What a trace is asked: a model's ``config.json`` and a run the worker can replay, checked before any
process starts (each refusal one line naming the field)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gpumem_gui.core import GpumemInputError, InferenceRun, LoadedModel, TrainingRun, resolve_tricks

# optimizers torch itself provides (the others need bitsandbytes or a GPU); the worker's OPTIMIZERS, which
# tests/test_trace.py checks against this (the product does not import the worker's modules)
TRACED_OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-fused", "adamw-for-loop", "sgd", "sgd-momentum")
# losses the worker computes (gpumem_trace_worker/tricks.py LOSSES, and the model's own)
TRACED_LOSSES = ("standard", "chunked", "chunked-linear")
# ZeroRedundancyOptimizer is traced around AdamW foreach (gpumem_trace_worker/distributed.py, _ddp)
ZERO1_OPTIMIZERS = ("adamw", "adamw-foreach")


class TraceRequest(BaseModel):
    """One worker request: ``{"config", "mode", "run", "trust_remote_code", "code_dir", "code_sha256"}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: dict[str, Any]
    mode: Literal["inference", "train"]
    run: dict[str, Any]
    trust_remote_code: bool = False
    # the local folder a config's auto_map points into, and a hash of its .py files (part of the cache key)
    code_dir: str | None = None
    code_sha256: str | None = None

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def key(self) -> str:
        """A stable hash of the config and the run (the cache adds the environment's versions)."""
        text = json.dumps(self.payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _check_inference(run: InferenceRun) -> None:
    if run.engine != "transformers":
        raise GpumemInputError(
            f"trace mode runs transformers; a {run.engine} run is estimated only", field="engine"
        )
    for name in ("tp", "pp", "ep"):
        if getattr(run, name) > 1:
            raise GpumemInputError(f"trace mode measures one GPU; {name} must be 1", field=name)
    if run.weights not in ("bf16", "fp16", "fp32", "file"):
        raise GpumemInputError(
            "trace mode builds the model in its compute dtype; choose --weights bf16/fp16/fp32 (a quantized "
            "format is traced from a checkpoint's quantization_config, not from --weights)",
            field="weights",
        )
    if run.cache_implementation == "static" and run.images:
        raise GpumemInputError(
            "trace mode runs a static cache for text prompts only; set --images 0",
            field="cache_implementation",
        )


def _check_training(run: TrainingRun) -> None:
    if run.method == "qlora":
        raise GpumemInputError(
            "QLoRA is not traced: bitsandbytes' 4- and 8-bit layers need a CUDA device", field="method"
        )
    if run.optimizer not in TRACED_OPTIMIZERS:
        raise GpumemInputError(
            f"optimizer {run.optimizer!r} is not traced; torch's own are: {', '.join(TRACED_OPTIMIZERS)}",
            field="optimizer",
        )
    if run.precision == "megatron-bf16":
        raise GpumemInputError("megatron-bf16 (Megatron-LM's optimizer) is not traced", field="precision")
    for name in ("tp", "pp", "ep", "cp"):
        if getattr(run, name) > 1:
            raise GpumemInputError(
                f"trace mode does not run {name} > 1 (data parallelism is traced per rank)", field=name
            )
    if run.zero > 1:
        raise GpumemInputError(
            f"ZeRO-{run.zero} is DeepSpeed's, which is not traced (ZeRO-1 is)", field="zero"
        )
    if run.zero == 1 and run.zero_impl != "torch":
        raise GpumemInputError(
            "DeepSpeed ZeRO is not traced; ZeRO-1 is traced as torch's ZeroRedundancyOptimizer "
            "(zero_impl 'torch')",
            field="zero_impl",
        )
    if run.zero == 1 and run.fsdp == "none" and run.optimizer not in ZERO1_OPTIMIZERS:
        raise GpumemInputError(
            f"ZeRO-1 is traced with torch's ZeroRedundancyOptimizer around AdamW; {run.optimizer!r} is not",
            field="optimizer",
        )
    if run.offload != "none":
        raise GpumemInputError("CPU offload is not traced", field="offload")
    _check_tricks(run)
    if run.fsdp != "none" and run.fsdp_version != 2:
        raise GpumemInputError(
            "FSDP1 (FullyShardedDataParallel) is not traced; FSDP2 (fully_shard, fsdp_version 2) is",
            field="fsdp_version",
        )
    if run.precision == "mp-bf16" and run.fsdp == "none":
        raise GpumemInputError("mp-bf16 is FSDP's mixed precision: trace it with fsdp", field="precision")


def _check_tricks(run: TrainingRun) -> None:
    """The framework tricks torch runs by itself are traced on one GPU; the others need packages or GPUs."""
    tricks = resolve_tricks(run)
    if tricks.loss not in TRACED_LOSSES:
        raise GpumemInputError(
            f"loss {tricks.loss!r} is not traced (it needs Liger/Triton or Megatron-LM); traced: "
            "standard, chunked (torchtune)",
            field="loss",
        )
    for name, on in (("float8", run.float8), ("compile", run.compile)):
        if on:
            raise GpumemInputError(f"{name} is not traced (it needs a GPU): it is modelled only", field=name)
    if tricks.ckpt_offload:
        raise GpumemInputError(
            "unsloth's offloaded gradient checkpointing is not traced; trace with grad_ckpt off",
            field="grad_ckpt",
        )
    used = run.optimizer_in_backward or run.activation_offload or tricks.loss != "standard"
    if used and (run.dp > 1 or run.zero or run.fsdp != "none"):
        raise GpumemInputError(
            "framework tricks (loss, optimizer_in_backward, activation_offload) are traced on one GPU only",
            field="dp",
        )


def make_request(
    model: LoadedModel, run: InferenceRun | TrainingRun, trust_remote_code: bool = False
) -> TraceRequest:
    """The request that traces ``run`` on ``model``; a run the trace cannot do is an input error."""
    if model.config is None:
        raise GpumemInputError(
            "trace mode builds the model from its config.json, which this source does not have (open a "
            "config.json, a model folder, a hub id or a catalog model)",
            source=model.source,
        )
    spec = model.spec
    tokens = run.seq + getattr(run, "new_tokens", 0)
    if spec is not None and spec.position_embedding == "learned" and tokens > spec.max_position_embeddings:
        raise GpumemInputError(
            f"{tokens} tokens exceed the model's {spec.max_position_embeddings} learned positions",
            field="seq",
        )
    if isinstance(run, InferenceRun):
        _check_inference(run)
        mode: Literal["inference", "train"] = "inference"
    else:
        _check_training(run)
        mode = "train"
    code_dir = _code_dir(model) if trust_remote_code and model.config.get("auto_map") else None
    doc = run.model_dump(mode="json")
    config = model.config
    if spec is not None and spec.encoder is not None:  # the worker builds AutoModelFor<task>
        doc["task"] = spec.encoder.head
        labels = spec.encoder.num_labels  # PreTrainedConfig: num_labels from id2label
        config = {**config, "id2label": {str(i): f"LABEL_{i}" for i in range(labels)}}
    if isinstance(run, TrainingRun) and resolve_tricks(run).loss != "standard":
        doc["loss"] = resolve_tricks(run).loss  # the framework's loss, as the worker names it
    if isinstance(run, TrainingRun):
        doc["fsdp_units"] = resolve_tricks(run).fsdp_units  # the modules sharded apart, resolved
    if isinstance(run, TrainingRun) and resolve_tricks(run).lora_model_dtype:
        doc["lora_model_dtype"] = True  # the framework's adapters in the model's dtype, not PEFT's fp32
    return TraceRequest(
        config=config,
        mode=mode,
        run=doc,
        trust_remote_code=trust_remote_code,
        code_dir=str(code_dir) if code_dir else None,
        code_sha256=_code_hash(code_dir) if code_dir else None,
    )


def _code_dir(model: LoadedModel) -> Path | None:
    """The local folder beside the model's config.json (its own code lives there), or None (hub, catalog)."""
    path = Path(model.source).expanduser().resolve()
    if not path.exists():
        return None
    return path if path.is_dir() else path.parent


def _code_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()
