"""Training: one optimizer step in steady state, on one GPU or per rank of a data-parallel job."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from .building import (
    WHOLE_MODEL,
    TraceError,
    attn_used,
    build,
    check_torch,
    is_multimodal,
    load_config,
    no_init_weights,
    patch_transformers_for_fake,
    quantization_notes,
    readable_failures,
    same_device_to,
    token_ids,
    whole_model,
)
from .tracking import memory_tracker
from .tricks import LOSSES, Offload, checkpoint_every, op_sac_context, optimizers_in_backward, standard_loss
from .vision import add_vision, constant_grids, image_inputs, image_request, outside_text

_OPTIM = {
    "adamw": {"foreach": True},
    "adamw-foreach": {"foreach": True},
    "adamw-fused": {"fused": True},
    "adamw-for-loop": {"foreach": False},
}
# what the worker can trace (gpumem_gui/trace/request.py refuses the rest before a process starts)
OPTIMIZERS = (*_OPTIM, "sgd", "sgd-momentum")
# dropout keys of the config classes, all set when the run names a dropout
_DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
    "hidden_dropout_prob",  # BertConfig / RobertaConfig (classifier_dropout None follows hidden_dropout_prob)
    "attention_probs_dropout_prob",
    "dropout_rate",  # T5Config / MT5Config / UMT5Config: every dropout of the model
)


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


# an encoder's head -> PEFT's task type (None: PeftModel, no head-specific modules_to_save)
_PEFT_TASKS = {"sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS", "masked_lm": None}


# a multimodal model built whole (building.whole_model): its text model's parameters, and the rest
_TEXT_PARTS = {"language_model", "lm_head"}
_NOT_TEXT = r"^(?!.*(language_model|lm_head)).*$"
_REACH = {
    "targets": "over the whole model (the vision tower and projector included)",
    "tower": "over the whole model but the projector",
    "excluded": "over the language model only",
}
# lora_vision_tower -> PEFT's exclude_modules (a regex fullmatched against each module's path): "targets" as
# get_peft_model resolves target_modules over the whole model; "tower" without the projector (LLaMA-Factory
# model/model_utils/misc.py find_all_linear_modules forbids the composite model's projector_key);
# "excluded" without the tower either (LLaMA-Factory's freeze_vision_tower default)
_TOWER_EXCLUDE = {
    "targets": None,
    "tower": r".*\.(multi_modal_projector|visual\.merger)(\..*)?",
    "excluded": _NOT_TEXT,
}


def lora(model: Any, run: dict[str, Any], exclude: str | None = None) -> Any:
    """PEFT's LoRA on the model, as ``get_peft_model`` resolves ``target_modules`` (``exclude``: modules left
    without adapters, the vision tower of a multimodal model built whole)."""
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora.layer import LoraLayer
    except ImportError:
        raise TraceError("LoRA needs peft in the tracing environment (pip install peft)") from None

    # peft moves each new adapter to its base layer's device, which cannot swap fake parameters; everything is
    # on the CPU device already, so skipping a move to it changes nothing
    LoraLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None
    targets = run.get("lora_targets", "all-linear")
    if isinstance(targets, list | tuple) and len(targets) == 1 and str(targets[0]).startswith("re:"):
        targets = str(targets[0])  # gpumem's regex target: PEFT takes a regex as one string
    if isinstance(targets, str) and targets.startswith("re:"):
        targets = targets[3:]
    elif isinstance(targets, str) and targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    conf = LoraConfig(
        r=int(run.get("lora_rank", 16)),
        lora_alpha=float(run.get("lora_alpha", 32)),
        lora_dropout=float(run.get("lora_dropout", 0.0)),
        target_modules=targets,
        exclude_modules=exclude,
        task_type=_PEFT_TASKS.get(run.get("task"), "CAUSAL_LM"),
    )
    # the adapters in the model's dtype, as torchtune builds them (the request says so: lora_model_dtype):
    # autocast_adapter_dtype=False, and the base layer's dtype that the skipped move would have given them
    keep = bool(run.get("lora_model_dtype", False))
    try:
        with same_device_to():
            peft = get_peft_model(model, conf, autocast_adapter_dtype=not keep)
    except ValueError as e:
        raise TraceError(f"peft: {str(e).splitlines()[0][:200]}") from None
    if keep:
        _adapters_like_base(peft, LoraLayer)
    return _refake_saved_modules(peft)


def _adapters_like_base(model: Any, layer_cls: type) -> None:
    """Each LoRA adapter's parameters made again in its base layer's float dtype (PEFT's
    ``_move_adapter_to_device_of_base_layer`` casts them so; skipped here, see :func:`lora`)."""
    import torch

    for layer in model.modules():
        if not isinstance(layer, layer_cls):
            continue
        base = getattr(layer.get_base_layer(), "weight", None)
        if base is None or not base.dtype.is_floating_point:
            continue
        for name in ("lora_A", "lora_B"):
            for mod in getattr(layer, name, {}).values():
                for key, p in list(mod._parameters.items()):
                    if p is not None and p.dtype != base.dtype:
                        fresh = torch.empty(p.shape, dtype=base.dtype)
                        mod._parameters[key] = torch.nn.Parameter(fresh, requires_grad=p.requires_grad)


def _refake_saved_modules(model: Any) -> Any:
    """PEFT's ``ModulesToSaveWrapper`` (a classification head under SEQ_CLS / TOKEN_CLS) deep-copies the
    module, which gives fake parameters a fake mode of their own; each copied parameter is made again, same
    shape, dtype and requires_grad, in the mode in force (a real run's copy is an ordinary tensor)."""
    import torch

    try:
        from peft.utils.other import ModulesToSaveWrapper
    except ImportError:
        return model
    for wrapper in model.modules():
        if not isinstance(wrapper, ModulesToSaveWrapper):
            continue
        for mod in wrapper.modules_to_save.modules():
            for key, p in list(mod._parameters.items()):
                if p is not None:
                    fresh = torch.empty(p.shape, dtype=p.dtype)
                    mod._parameters[key] = torch.nn.Parameter(fresh, requires_grad=p.requires_grad)
    return model


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
        raise TraceError("QLoRA is not traced: bitsandbytes' 4- and 8-bit layers need a CUDA device")
    cfg = load_config(raw, trust, notes)
    for k in _DROPOUT_KEYS:
        if run.get("dropout") is not None and hasattr(cfg, k):
            setattr(cfg, k, float(run["dropout"]))
    weights, _ = precision_dtypes(run)
    images = image_request(cfg, run) is not None  # images in each sequence (vision.py): the whole model
    token = WHOLE_MODEL.set(images)
    try:
        model = build(cfg, weights, run.get("attn", "sdpa"), trust, notes, run.get("task"))
    finally:
        WHOLE_MODEL.reset(token)
    whole = is_multimodal(cfg) and run.get("task") is None and (images or whole_model(cfg))
    trains_tower = images and bool(run.get("train_vision_tower")) and run.get("method", "full") == "full"
    if whole and not trains_tower:  # built with its vision tower, kept frozen (TRL / LLaMA-Factory
        # freeze_vision_tower default): no gradient or optimizer state for it, nothing saved for backward
        for name, p in model.named_parameters():
            if not _TEXT_PARTS & set(name.split(".")):
                p.requires_grad_(False)
    if images:
        notes[:] = [n for n in notes if "run with text only" not in n]
        notes.append(
            "images: the whole model with its vision tower trained (train_vision_tower): the tower and "
            "projector get gradients and optimizer states"
            if trains_tower
            else "images: the whole model with its vision tower frozen; the tower and projector get no "
            "gradient, so torch's optimizers keep no state for them"
        )
    elif is_multimodal(cfg):
        notes.append(
            "multimodal: a text-only step; the vision tower and projector get no gradient, so torch's "
            "optimizers keep no state for them"
        )
    if run.get("grad_ckpt"):
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if run.get("ckpt_policy", "full") == "selective-op":
            kwargs["context_fn"] = op_sac_context()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if int(run.get("ckpt_every", 1)) > 1:
            checkpoint_every(model, int(run["ckpt_every"]))
    # a text step's targets reach the tower as with images (get_peft_model adapts the whole model); the
    # tower's adapters get no gradient there (trace_training's warm-up leaves them out); a text step that
    # builds the language model alone counts them with the tower (_add_tower_adapters)
    if run.get("method") == "lora":
        reach = _reach(run)
        model = lora(model, run, _TOWER_EXCLUDE[reach] if whole else None)
        if whole:
            notes.append(f"LoRA: lora_vision_tower {reach}: PEFT resolved the targets as {_REACH[reach]}")
    model.train()
    out["attn_implementation_used"] = attn_used(model)
    out["trainable_params"] = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
    return cfg, model, token_ids(cfg, int(run.get("batch", 1)), int(run.get("seq", 2048)))


def _reach(run: dict[str, Any]) -> str:
    reach = str(run.get("lora_vision_tower", "targets"))
    if reach not in _TOWER_EXCLUDE:
        raise TraceError(
            f"lora_vision_tower {reach!r}: targets, tower or excluded", field="lora_vision_tower"
        )
    return reach


def _add_tower_adapters(out: dict[str, Any], cfg: Any, run: dict[str, Any], dtype: Any) -> None:
    """A text-only LoRA step of a multimodal model whose language model was traced alone (add_vision adds
    the tower): the adapters PEFT puts on the tower's and projector's linears, as ``get_peft_model``
    resolves the targets over the whole model (built with weight init off, as ``vision_params`` builds it),
    added to the parameters of every phase and to the trainable count; no image reaches them, so they get
    no gradient and torch's optimizers no state."""
    from transformers import AutoModelForImageTextToText

    reach = _reach(run)
    if reach == "excluded" or getattr(cfg, "vision_config", None) is None:
        return
    with same_device_to(), no_init_weights():
        whole = AutoModelForImageTextToText.from_config(copy.deepcopy(cfg), dtype=dtype)
    peft_model = lora(whole, run, _TOWER_EXCLUDE[reach])
    added = [p for n, p in peft_model.named_parameters() if p.requires_grad and outside_text(n)]
    nbytes = sum(p.numel() * p.element_size() for p in added)
    out["trainable_params"] += sum(p.numel() for p in added)
    for ph in out["phases"].values():
        ph["Parameter"] = ph.get("Parameter", 0) + nbytes
        ph["Total"] = ph.get("Total", 0) + nbytes


def forward_loss(model: Any, ids: Any, run: dict[str, Any], offload: Any, extra: dict[str, Any]) -> Any:
    """The loss of one micro-batch: the model's own (``labels=input_ids``; ``extra``: the processor's image
    tensors), or the decoder under the offloading hooks and the head + loss after them, or torchtune's
    chunked losses (:mod:`.tricks`)."""
    loss_name = run.get("loss", "auto")
    if extra and (loss_name not in ("auto", "standard") or offload is not None or run.get("task")):
        raise TraceError("images are traced with the model's own loss only, without activation offload")
    task = run.get("task")
    if task is not None:  # an encoder's head: labels per sequence (a view of the first ids) or per token
        labels = ids[:, 0] if task == "sequence_classification" else ids
        return model(input_ids=ids, labels=labels).loss
    if loss_name in ("auto", "standard") and offload is None:
        return model(input_ids=ids, labels=ids, use_cache=False, **extra).loss
    if loss_name not in ("auto", "standard") and loss_name not in LOSSES:
        raise TraceError(f"loss {loss_name!r} is not traced (torch runs: standard, chunked, chunked-linear)")
    hooks = offload.hooks() if offload is not None else contextlib.nullcontext()
    decoder = getattr(model, "get_base_model", lambda: model)().model
    with hooks:
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
    fn = LOSSES.get(loss_name, standard_loss)
    return fn(model, hidden, ids, int(run.get("loss_chunks", 8)))


def step(
    model: Any,
    opt: Any,
    mt: Any,
    ids: Any,
    autocast: Any,
    accum: int,
    run: dict[str, Any],
    offload: Any = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One optimizer step under ``mt``: ``accum`` micro-batches of forward + loss and backward, the step
    (``opt`` None: the optimizer runs in backward)."""
    import torch

    for _ in range(accum):
        mt.enter("forward")
        ac = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ac:
            loss = forward_loss(model, ids, run, offload, extra or {})
        mt.enter("backward", forward=False)
        loss.backward()
        del loss
    mt.enter("optimizer", forward=False)
    if opt is not None:
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
        if int(run.get("images", 0) or 0):
            raise TraceError("images are traced on one device only (no data parallelism)", field="images")
        from .distributed import trace_data_parallel

        return trace_data_parallel(raw, run, trust_remote_code)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    notes: list[str] = []
    out: dict[str, Any] = {"notes": notes, "quantization": quantization_notes(raw, notes)}
    accum = max(1, min(2, int(run.get("grad_accum", 1))))
    weights, autocast = precision_dtypes(run)
    with FakeTensorMode(), readable_failures(), contextlib.ExitStack() as stack:
        cfg, model, ids = prepare(raw, run, trust_remote_code, out)
        extra: dict[str, Any] = {}
        if (req := image_request(cfg, run)) is not None:  # the processor's tensors, image tokens first
            stack.enter_context(constant_grids())  # after the build imported the modeling code
            ids, extra = image_inputs(model, cfg, int(run.get("batch", 1)), int(run.get("seq", 2048)), req)
            out["image_tokens"] = int(ids.shape[1]) - int(run.get("seq", 2048))
        params = [p for p in model.parameters() if p.requires_grad]
        # a text step of a model built whole: the tower's adapters (LoRA) get no gradient in any such step,
        # so the warm-up steps (the steady state) give them none either, as torch keeps no state for them
        text_whole = req is None and is_multimodal(cfg) and whole_model(cfg) and run.get("task") is None
        unused = {id(p) for n, p in model.named_parameters() if text_whole and outside_text(n)}
        warm = [p for p in params if id(p) not in unused]
        name = run.get("optimizer", "adamw")
        in_bwd = bool(run.get("optimizer_in_backward"))
        opts = [optimizer(params, name)] if not in_bwd else []
        if in_bwd:  # warm the per-parameter optimizers before their hooks exist
            opts = [optimizer([p], name) for p in params]
        if not run.get("first_step"):
            for p in warm:
                p.grad = torch.zeros_like(p)
            for o in opts:
                o.step()
                o.zero_grad(set_to_none=True)
        if in_bwd:
            by_param = dict(zip(params, opts, strict=True))
            optimizers_in_backward(params, lambda ps: by_param[ps[0]])
        offload = Offload() if run.get("activation_offload") else None
        mt = memory_tracker()
        mt.track_external(model, ids, *opts, *extra.values())
        with mt:
            step(model, None if in_bwd else opts[0], mt, ids, autocast, accum, run, offload, extra)
        out["phases"] = dict(mt.phase_peaks)
        if offload is not None:
            out["host_bytes"] = offload.host_peak
            notes.append(
                f"activation offload: {offload.host_peak} bytes of saved activations in CPU RAM at most "
                "(not counted; torchtune OffloadActivations rules)"
            )
        if req is None:  # with images the whole model was built: its vision tower is in every phase
            add_vision(out, cfg, weights)
            if run.get("method") == "lora" and is_multimodal(cfg) and not whole_model(cfg):
                _add_tower_adapters(out, cfg, run, weights)
        del model, opts, ids, extra
    return out
