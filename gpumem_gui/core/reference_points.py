"""Runs that reproduce a PyTorch-measured reference point (``groundtruth.json`` ``grid`` layout).

The reference measurements (``shared/reference/README.md``) describe each point by a mode name and a few
fields; these functions turn one into the :class:`InferenceRun` or :class:`TrainingRun` it stands for, so the
accuracy tests and ``validation/validate.py`` map points the same way.

Modes: ``infer_prefill`` (logits for every position), ``infer_prefill_last_logit`` (the last one, as
``generate()``), ``train_amp_adamw`` (fp32 weights under bf16 autocast, AdamW foreach), ``..._gc``
(+ non-reentrant activation checkpointing), ``train_bf16_adamw`` (pure bf16), and ``lora_amp`` /
``lora_bf16`` (+ ``_gc``): PEFT LoRA on a bf16 base with fp32 adapters, with or without autocast.
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.runtimes.inference import InferenceRun, make_run
from gpumem_gui.core.training import TrainingRun, make_training_run


def _attn(p: dict[str, Any]) -> str:
    return str(p.get("attn_implementation_used") or p["attn_implementation"])


def inference_run_for_point(p: dict[str, Any]) -> InferenceRun:
    """bf16 weights, no generated tokens; ``infer_prefill`` keeps all logits, the last-logit mode one."""
    return make_run(
        batch=p["batch"],
        seq=p["seq"],
        new_tokens=0,
        weights="bf16",
        attn=_attn(p),
        logits="all" if p["mode"] == "infer_prefill" else "last",
    )


def training_run_for_point(p: dict[str, Any]) -> TrainingRun:
    """The training run of a ``train_*`` or ``lora_*`` point (see the module docstring)."""
    mode = p["mode"]
    kw: dict[str, object] = {
        "batch": p["batch"],
        "seq": p["seq"],
        "attn": _attn(p),
        "grad_ckpt": mode.endswith("_gc"),
    }
    if mode.startswith("lora"):
        targets = p["lora_targets"]
        kw.update(
            method="lora",
            precision="amp-bf16" if mode.startswith("lora_amp") else "bf16",
            lora_rank=p["lora_rank"],
            lora_dropout=p.get("lora_dropout", 0.0),
            lora_targets=targets if targets == "all-linear" else tuple(targets),
        )
    else:
        kw["precision"] = "amp-bf16" if "amp" in mode else "bf16"
    drop = [v for k, v in (p.get("config_override") or {}).items() if "drop" in k]
    if drop:
        kw["dropout"] = float(max(drop))
    return make_training_run(**kw)


def run_for_point(p: dict[str, Any]) -> InferenceRun | TrainingRun:
    """The run of any reference point: ``infer_*`` modes are inference, the others a training step."""
    return inference_run_for_point(p) if p["mode"].startswith("infer") else training_run_for_point(p)


# the bars the accuracy tests hold traced points to (tests/test_replay.py; docs/validation.md section f says
# the same): a prefill/decode peak within 3 % (tiny synthetic MoE routers' fp32 scratch is a visible share),
# a training step's peak within 0.5 %
TRACED_INFERENCE_TOLERANCE = 0.03
TRACED_TRAINING_TOLERANCE = 0.005


def traced_inference_run(p: dict[str, Any]) -> InferenceRun:
    """The run of a point of ``tests/reference/trace/inference.json`` (the worker's own run fields), with
    the attention implementation the trace really used."""
    r = p["run"]
    return make_run(
        batch=r["batch"],
        seq=r["seq"],
        new_tokens=r.get("new_tokens", 0),
        attn=p.get("attn_implementation_used") or r["attn"],
        logits=r.get("logits", "last"),
    )


def traced_training_run(p: dict[str, Any]) -> TrainingRun:
    """The run of a point of ``tests/reference/trace/train.json``, with the attention implementation used."""
    r = dict(p["run"])
    r["attn"] = p.get("attn_implementation_used") or r.get("attn", "sdpa")
    return make_training_run(**r)
