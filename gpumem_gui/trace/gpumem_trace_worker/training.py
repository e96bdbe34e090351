"""Training: one optimizer step in steady state, on one GPU or per rank of a data-parallel job."""

from __future__ import annotations

import contextlib
from typing import Any

from .building import (
    TraceError,
    add_vision,
    attn_used,
    build,
    check_torch,
    is_multimodal,
    load_config,
    patch_transformers_for_fake,
    quantization_notes,
    readable_failures,
    same_device_to,
    token_ids,
)
from .tracking import memory_tracker

_OPTIM = {
    "adamw": {"foreach": True},
    "adamw-foreach": {"foreach": True},
    "adamw-fused": {"fused": True},
    "adamw-for-loop": {"foreach": False},
}
# what the worker can trace (gpumem_gui/trace/request.py refuses the rest before a process starts)
OPTIMIZERS = (*_OPTIM, "sgd", "sgd-momentum")
# dropout keys of the config classes, all set when the run names a dropout
_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout")


def optimizer(params: list[Any], name: str) -> Any:
    """torch's own optimizers (the 8-bit, paged, Adafactor and Lion ones need packages and GPUs)."""
    import torch

    if name in _OPTIM:
        return torch.optim.AdamW(params, lr=1e-5, **_OPTIM[name])
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    raise TraceError(f"optimizer {name!r} is not traced (torch's own optimizers only: AdamW, SGD)")


def lora(model: Any, run: dict[str, Any]) -> Any:
    """PEFT's LoRA on the model, as ``get_peft_model`` resolves ``target_modules``."""
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora.layer import LoraLayer
    except ImportError:
        raise TraceError("LoRA needs peft in the tracing environment (pip install peft)") from None

    # peft moves each new adapter to its base layer's device, which cannot swap fake parameters; everything is
    # on the CPU device already, so skipping a move to it changes nothing
    LoraLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None
    targets = run.get("lora_targets", "all-linear")
    if isinstance(targets, str) and targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    conf = LoraConfig(
        r=int(run.get("lora_rank", 16)),
        lora_alpha=float(run.get("lora_alpha", 32)),
        lora_dropout=float(run.get("lora_dropout", 0.0)),
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    try:
        with same_device_to():
            return get_peft_model(model, conf)
    except ValueError as e:
        raise TraceError(f"peft: {str(e).splitlines()[0][:200]}") from None


def precision_dtypes(run: dict[str, Any]) -> tuple[Any, Any]:
    """(weights dtype, autocast dtype or None) as HF Trainer runs the precision."""
    import torch

    precision, method = run.get("precision", "amp-bf16"), run.get("method", "full")
    if precision == "megatron-bf16":
        raise TraceError("megatron-bf16 is Megatron-LM's optimizer, which is not traced")
    autocast = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)
    if method == "full":
        weights = torch.float32 if autocast is not None or precision == "fp32" else torch.bfloat16
    else:
        weights = {"fp32": torch.float32, "amp-fp16": torch.float16}.get(precision, torch.bfloat16)
    return weights, autocast


def prepare(
    raw: dict[str, Any], run: dict[str, Any], trust: bool, out: dict[str, Any]
) -> tuple[Any, Any, Any]:
    """The config (with the run's dropout), the model to train before any wrapping, and the batch of token
    ids; the attention implementation used and the trainable parameter count go into ``out``."""
    notes = out["notes"]
    check_torch()
    patch_transformers_for_fake()
    if run.get("method") == "qlora":
        raise TraceError("QLoRA is not traced: bitsandbytes' 4-bit layers need a CUDA device")
    cfg = load_config(raw, trust, notes)
    for k in _DROPOUT_KEYS:
        if run.get("dropout") is not None and hasattr(cfg, k):
            setattr(cfg, k, float(run["dropout"]))
    weights, _ = precision_dtypes(run)
    model = build(cfg, weights, run.get("attn", "sdpa"), trust, notes)
    if is_multimodal(cfg):
        notes.append(
            "multimodal: a text-only step; the vision tower and projector get no gradient, so torch's "
            "optimizers keep no state for them"
        )
    if run.get("grad_ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run.get("method") == "lora":
        model = lora(model, run)
    model.train()
    out["attn_implementation_used"] = attn_used(model)
    out["trainable_params"] = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
    return cfg, model, token_ids(cfg, int(run.get("batch", 1)), int(run.get("seq", 2048)))


def step(model: Any, opt: Any, mt: Any, ids: Any, autocast: Any, accum: int) -> None:
    """One optimizer step under ``mt``: ``accum`` micro-batches of forward + loss and backward, the step."""
    import torch

    for _ in range(accum):
        mt.enter("forward")
        ac = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ac:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        mt.enter("backward", forward=False)
        loss.backward()
        del loss
    mt.enter("optimizer", forward=False)
    opt.step()
    opt.zero_grad(set_to_none=True)


def trace_training(
    raw: dict[str, Any], run: dict[str, Any], trust_remote_code: bool = False
) -> dict[str, Any]:
    for k in ("tp", "pp", "ep", "cp"):
        if int(run.get(k, 1)) > 1:
            raise TraceError(
                f"{k} > 1 is not traced: tensor, pipeline, expert and context parallelism are not"
            )
    if int(run.get("dp", 1)) > 1 or run.get("zero") or run.get("fsdp", "none") != "none":
        from .distributed import trace_data_parallel

        return trace_data_parallel(raw, run, trust_remote_code)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    notes: list[str] = []
    out: dict[str, Any] = {"notes": notes, "quantization": quantization_notes(raw, notes)}
    accum = max(1, min(2, int(run.get("grad_accum", 1))))
    weights, autocast = precision_dtypes(run)
    with FakeTensorMode(), readable_failures():
        cfg, model, ids = prepare(raw, run, trust_remote_code, out)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = optimizer(params, run.get("optimizer", "adamw"))
        if not run.get("first_step"):
            for p in params:
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
        mt = memory_tracker()
        mt.track_external(model, ids, opt)
        with mt:
            step(model, opt, mt, ids, autocast, accum)
        out["phases"] = dict(mt.phase_peaks)
        add_vision(out, cfg, weights)
        del model, opt, ids
    return out
