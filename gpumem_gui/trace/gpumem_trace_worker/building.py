"""Building the real model under fake tensors, and what fake tensors cannot do.

Handled here, each named in the result's ``notes`` when it applies:

* transformers code paths that read tensor values take the path a real run takes: packed-sequence detection
  (a real unpacked batch returns None) and grouped_mm for non-bf16 expert weights (transformers' own
  fallback, same shapes and dtypes);
* ``from_config`` writes the MoE implementation into the config: every build gets its own copy;
* ``Module.to()`` of a fake parameter to the device it is on (modules and peft adapters that move themselves
  in ``__init__``) is a no-op instead of a failed swap;
* a multimodal config builds its language model (the forward would look for image tokens); the vision tower
  is built on its own and its parameters and buffers are added to the count (``vision.add_vision``);
* a ``quantization_config`` is ignored by ``from_config`` (and a missing kernel dequantizes): the weights are
  traced in the compute dtype and the result says so, for the caller to account the quantized bytes;
* modules whose fast kernels are missing (mamba, causal-conv1d, flash-linear-attention) run their
  pure-PyTorch fallback: the result says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from .encoders import TASKS, value_free_init
from .seq2seq import auto_class

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# modules that have a fused kernel in these packages and a pure-PyTorch fallback in transformers
_KERNEL_PACKAGES = {"Mamba": "mamba_ssm", "Conv1d": "causal_conv1d", "GatedDeltaNet": "fla"}


class TraceError(Exception):
    """A request the worker cannot run; its message is one line naming the cause, ``field`` the request
    field to change (``trust_remote_code``: the config needs the model's own code)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' log at error level (it sets its own level when first imported, so import it first)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def package_versions() -> dict[str, str]:
    """Python and the installed torch / transformers / peft, from package metadata (nothing imported): the
    environment a trace would run in, asked before any trace (and part of the cache key)."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "peft"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[name] = md.version(name)
    return out


def versions() -> dict[str, str]:
    """The versions the trace ran with, from the imported modules."""
    import torch
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    with contextlib.suppress(ImportError):
        import peft

        out["peft"] = peft.__version__
    return out


def check_torch() -> None:
    try:
        from torch.distributed._tools.mem_tracker import MemTracker  # noqa: F401
    except ImportError:
        import torch

        raise TraceError(
            f"torch {torch.__version__} has no torch.distributed._tools.mem_tracker (torch 2.5 or newer "
            "needed)"
        ) from None


def patch_transformers_for_fake() -> None:
    """Two transformers helpers that read tensor values, which fake tensors do not have:
    ``masking_utils.find_packed_sequence_indices`` (no packed sequences in a trace) and, for MoE models,
    ``integrations.moe._can_use_grouped_mm``, whose probe is kept for bf16 weights only (the grouped_mm
    kernel's dtype) so other dtypes take the per-expert loop as on a GPU without the kernel."""
    import torch
    import transformers.masking_utils as mu

    mu.find_packed_sequence_indices = lambda position_ids: None
    with contextlib.suppress(ImportError, AttributeError):  # a transformers without the MoE integration
        import transformers.integrations.moe as moe

        orig = moe._can_use_grouped_mm
        if not getattr(orig, "_gpumem", False):

            def can(input: Any, weight: Any, offs: Any) -> bool:
                return weight.dtype == torch.bfloat16 and orig(input, weight, offs)

            can._gpumem = True  # type: ignore[attr-defined]
            moe._can_use_grouped_mm = can


@contextlib.contextmanager
def same_device_to() -> Iterator[None]:
    """``Module.to(device)`` to the CPU device everything is on already returns the module unchanged (a fake
    parameter cannot be swapped for a copy of itself)."""
    import torch

    to = torch.nn.Module.to

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == 1 and str(args[0]) == "cpu":
            return self
        try:
            return to(self, *args, **kwargs)
        except RuntimeError as e:
            if "swap" not in str(e):
                raise
            return _replace_params(self, *args, **kwargs)

    torch.nn.Module.to = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = to  # type: ignore[method-assign]


# the local folder whose .py files a config's auto_map names (set per request by handle())
CODE_DIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("CODE_DIR", default=None)
WHOLE_MODEL = contextvars.ContextVar("WHOLE_MODEL", default=False)  # a prompt with images (vision.py)


def _replace_params(module: Any, *args: Any, **kwargs: Any) -> Any:
    """``module.to(...)`` when torch cannot swap a fake parameter in place (a reference to it is held, e.g.
    PEFT casting a new adapter of an expert-weight parameter): each parameter and buffer is replaced by its
    converted copy, as ``Module._apply`` does for ordinary tensors."""
    import torch

    with torch.no_grad():
        for mod in module.modules():
            for key, p in list(mod._parameters.items()):
                if p is not None:
                    mod._parameters[key] = torch.nn.Parameter(
                        p.to(*args, **kwargs), requires_grad=p.requires_grad
                    )
            for key, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[key] = b.to(*args, **kwargs)
    return module


def load_config(raw: dict[str, Any], trust_remote_code: bool, notes: list[str] | None = None) -> Any:
    """transformers' config object for ``raw``; with ``trust_remote_code``, the config's own classes from
    the model folder (the .py files its ``auto_map`` names), which the result's notes then name."""
    from transformers import AutoConfig

    code_dir = CODE_DIR.get()
    if trust_remote_code and raw.get("auto_map") and code_dir is None:
        raise TraceError(
            "the model's own code is run from a local folder only: download the repository (config.json "
            "and its .py files) and open the folder"
        )
    with tempfile.TemporaryDirectory() as tmp:
        # named as the model folder: transformers caches the config's module under this name
        d = os.path.join(tmp, os.path.basename(os.path.normpath(code_dir)) if code_dir else "model")
        os.mkdir(d)
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            json.dump(raw, f)
        custom = trust_remote_code and code_dir is not None and bool(raw.get("auto_map"))
        if custom:
            for name in sorted(os.listdir(code_dir)):  # the config's module and what it imports
                if name.endswith(".py"):
                    shutil.copy(os.path.join(code_dir, name), d)
        try:
            cfg = AutoConfig.from_pretrained(d, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError, TypeError, OSError, ImportError) as e:
            msg = str(e).splitlines()[0][:200]
            if "trust_remote_code" in msg or "custom code" in msg:
                raise TraceError(
                    "the config needs the model's own code: rerun with --trust-remote-code if you trust it",
                    field="trust_remote_code",
                ) from None
            raise TraceError(f"transformers rejects the config: {msg}") from None
    if custom:
        cfg.name_or_path = code_dir  # from_config loads the model class from here
        if notes is not None:
            refs = _class_refs(raw["auto_map"])
            names = sorted({ref.split("--")[-1].split(".")[0] + ".py" for ref in refs})
            notes.append(f"ran the model's own code from {code_dir}: {', '.join(names)}")
    return cfg


def _class_refs(auto_map: Any) -> list[str]:
    """The ``module.Class`` references of an ``auto_map`` (values are strings or lists with nulls)."""
    values = auto_map.values() if isinstance(auto_map, dict) else []
    flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
    return [x for x in flat if isinstance(x, str) and "." in x]


def text_config(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def is_multimodal(cfg: Any) -> bool:
    return text_config(cfg) is not cfg and getattr(cfg, "vision_config", None) is not None


def token_ids(cfg: Any, batch: int, seq: int) -> Any:
    """A (batch, seq) batch of token ids: fake tensors hold no values; only the shape matters for memory."""
    import torch

    return torch.randint(0, int(text_config(cfg).vocab_size), (batch, seq))


def _is_moe(cfg: Any) -> bool:
    tc = text_config(cfg)
    return any(
        isinstance(getattr(tc, k, None), int) and getattr(tc, k) > 1
        for k in ("num_local_experts", "num_experts", "n_routed_experts")
    )


def build(
    cfg: Any, dtype: Any, attn: str, trust_remote_code: bool, notes: list[str], task: str | None = None
) -> Any:
    """The causal LM of ``cfg`` (its language model when ``cfg`` is multimodal) in ``dtype``; with ``task``,
    the encoder with that head (:data:`TASKS`)."""
    import transformers

    if task is not None and task not in TASKS:
        raise TraceError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}", field="task")
    auto = getattr(transformers, TASKS[task]) if task is not None else auto_class(cfg)  # seq2seq.py

    whole = is_multimodal(cfg) and task is None and (WHOLE_MODEL.get() or whole_model(cfg))
    if whole:
        auto = transformers.AutoModelForImageTextToText  # no causal LM of the text config alone
        notes.append("multimodal: the whole model is built (its vision tower loaded) and run with text only")
    elif is_multimodal(cfg):
        notes.append(
            "multimodal: the language model is traced (its forward with text only); the parameters and "
            "buffers of the vision tower and projector are added to every phase"
        )
        cfg = text_config(cfg)
    if attn == "flash":
        # flash_attention_2 needs the flash-attn package and a CUDA device; on a GPU, transformers' sdpa path
        # (is_causal, no mask) dispatches to the same flash kernel, which keeps only the logsumexp
        notes.append(
            "flash-attention needs CUDA: traced with sdpa, which runs the same fused kernel on a GPU"
        )
        attn = "sdpa"
    kw: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn, "trust_remote_code": trust_remote_code}
    if _is_moe(cfg):
        kw["experts_implementation"] = "grouped_mm"
    for _ in range(3):
        try:
            init = value_free_init() if task is not None or whole else contextlib.nullcontext()  # SigLIP too
            with same_device_to(), init:
                model = auto.from_config(copy.deepcopy(cfg), **kw)
            _kernel_notes(model, notes)
            return model
        except (TypeError, ValueError) as e:
            msg = str(e)
            if "experts" in msg and "experts_implementation" in kw:
                kw.pop("experts_implementation")
            elif kw.get("attn_implementation") == "sdpa" and "scaled_dot_product_attention" in msg:
                kw["attn_implementation"] = "eager"  # what transformers itself falls back to (BLOOM, Gemma-2)
            else:
                raise TraceError(
                    f"transformers cannot build the model: {msg.splitlines()[0][:200]}"
                ) from None
    raise TraceError("transformers cannot build the model")


def whole_model(cfg: Any) -> bool:
    """A text config without a causal LM of its own (Qwen2_5_VLTextConfig, MllamaTextConfig): build whole."""
    from transformers import AutoModelForCausalLM

    return type(text_config(cfg)) not in AutoModelForCausalLM._model_mapping


def no_init_weights() -> Any:
    """transformers' context that skips weight init (its home moved between versions)."""
    for where in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        if hasattr(module, "no_init_weights"):
            return module.no_init_weights()
    return contextlib.nullcontext()


def quantization_notes(raw: dict[str, Any], notes: list[str]) -> str | None:
    """The config's quantization method; the trace counts the weights in the compute dtype instead."""
    q = raw.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "unknown"))
    notes.append(
        f"quantization_config ({method}) is not applied by from_config: the weights were traced in the "
        "compute dtype; their quantized bytes come from the quantization config or the files' headers"
    )
    return method


def _kernel_notes(model: Any, notes: list[str]) -> None:
    kinds = {type(m).__name__ for m in model.modules()}
    for marker, package in _KERNEL_PACKAGES.items():
        if any(marker in k for k in kinds) and importlib.util.find_spec(package) is None:
            notes.append(
                f"{package} is not installed: the model's {marker} modules ran transformers' pure-PyTorch "
                "fallback, whose activations differ from the fused kernel's"
            )


def attn_used(model: Any) -> str | None:
    c = getattr(model, "config", None)
    for obj in (c, text_config(c) if c is not None else None):
        if obj is not None and getattr(obj, "_attn_implementation", None):
            return str(obj._attn_implementation)
    return None


@contextlib.contextmanager
def readable_failures() -> Iterator[None]:
    """Turn what fake tensors cannot run into one line: code that reads tensor values (dynamic RoPE
    variants, masks built from data) and shape errors of a run the model cannot do."""
    try:
        yield
    except TraceError:
        raise
    except Exception as e:
        name = type(e).__name__
        first = (str(e).splitlines() or [""])[0][:200]
        if "DataDependent" in name or "data-dependent" in first or "Dynamic" in name:
            raise TraceError(
                f"the model's code reads tensor values, which fake tensors do not have ({name}: {first})"
            ) from None
        raise TraceError(f"the model's forward failed under fake tensors: {name}: {first}") from None
