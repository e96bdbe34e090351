"""Trace the prefill (and decode) of multimodal models with images: ``tests/reference/vision/points.json``.

Each point runs the trace worker (``gpumem_gui/trace/gpumem_trace_worker``: the real transformers model under
FakeTensorMode, counted by torch's MemTracker, the images fed as the processor returns them,
``gpumem_trace_worker/vision.py``) on a config of ``tests/reference/vision/configs`` (scaled-down copies of
``tests/reference/extra/configs/synthetic__*-tiny.json`` whose image token ids lie inside their vocabulary,
as a real checkpoint's do; README.md).

    .venv/bin/python tests/reference/vision/make_points.py [--python /tmp/gt-venv/bin/python] [--only KEY]
        [--mode train | lora-tower]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORKER_PARENT = REPO / "gpumem_gui" / "trace"
OUT = HERE / "points.json"

_RUNS = (
    {"batch": 1, "seq": 64, "images": 2, "image_size": 224},
    {"batch": 2, "seq": 100, "images": 1, "image_size": 448},
    {"batch": 1, "seq": 2000, "images": 2, "image_size": 336},
    {"batch": 1, "seq": 30, "images": 3, "image_size": 700, "new_tokens": 20},
    {"batch": 1, "seq": 64, "images": 1, "image_size": 1024, "logits": "all"},
)
POINTS: dict[str, tuple[dict, ...]] = {
    "qwen2_5_vl-vision-tiny": _RUNS,
    "qwen3_vl-vision-tiny": _RUNS,
    "qwen3_vl_moe-vision-tiny": _RUNS[:2],
    "mistral3-vision-tiny": _RUNS,
    "gemma3-vision-tiny": _RUNS,  # image_size ignored: Gemma 3 resizes every image to 448 here (896 real)
    "llama4-vision-tiny": _RUNS,  # image_size: tiles of 112 px here (336 real), up to 4 x 4 and a global one
}


# training steps with images (the tower frozen): ``training_points.json``
TRAIN_OUT = HERE / "training_points.json"
_STEPS = (
    {"method": "full", "batch": 1, "seq": 64, "images": 2, "image_size": 224},
    # LoRA with the tower left out of the targets (LLaMA-Factory's freeze_vision_tower default)
    {
        "method": "lora",
        "batch": 2,
        "seq": 100,
        "images": 1,
        "image_size": 448,
        "lora_vision_tower": "excluded",
    },
    {
        "method": "lora",
        "batch": 1,
        "seq": 200,
        "images": 2,
        "image_size": 336,
        "grad_ckpt": True,
        "lora_vision_tower": "excluded",
    },
)
# the vision tower trained (train_vision_tower: LLaMA-Factory freeze_vision_tower false;
# replay/vision_train.py)


def _trained(*steps: dict) -> tuple[dict, ...]:
    """Full fine-tuning steps with the vision tower trained."""
    return tuple({"method": "full", **step, "train_vision_tower": True} for step in steps)


_TOWER_STEPS = _trained(
    {"batch": 1, "seq": 64, "images": 2, "image_size": 224},
    {"batch": 2, "seq": 100, "images": 1, "image_size": 448},
    {"batch": 1, "seq": 200, "images": 2, "image_size": 336, "grad_ckpt": True},
    {"batch": 1, "seq": 64, "images": 3, "image_size": 224, "precision": "bf16"},
)
_QWEN_TOWER_STEPS = _trained(
    {"batch": 1, "seq": 64, "images": 2, "image_size": 224},
    {"batch": 1, "seq": 64, "images": 4, "image_size": 448},
    {"batch": 1, "seq": 100, "images": 2, "image_size": 700, "grad_ckpt": True},
    {"batch": 2, "seq": 64, "images": 1, "image_size": 448, "precision": "bf16"},
)
TRAIN_POINTS: dict[str, tuple[dict, ...]] = {
    "gemma3-vision-tiny": _STEPS + _TOWER_STEPS,
    # Llama 4's LoRA steps with the tower: LORA_POINTS; its tower trained: replay/vision_train_llama4.py
    "llama4-vision-tiny": _STEPS[:1] + _TOWER_STEPS,
    "qwen2_5_vl-vision-tiny": _STEPS[:2] + _QWEN_TOWER_STEPS,
    "qwen3_vl-vision-tiny": _STEPS[:1] + _QWEN_TOWER_STEPS,
    # the same tower (and deepstack) under the MoE text model: trained, without and with checkpointing
    "qwen3_vl_moe-vision-tiny": _QWEN_TOWER_STEPS[0:3:2],
    "mistral3-vision-tiny": _STEPS[:1] + _QWEN_TOWER_STEPS,  # dynamic resolution as the Qwen towers
}


# LoRA reaching the vision tower (lora_vision_tower; replay/vision_train_lora.py): ``lora_tower_points.json``
LORA_OUT = HERE / "lora_tower_points.json"
_LORA = {"method": "lora", "batch": 1, "seq": 64, "images": 2, "image_size": 224}
_LORA_STEPS = (
    _LORA,  # all-linear over the whole model, as PEFT resolves it (TRL)
    {**_LORA, "seq": 100, "image_size": 448, "grad_ckpt": True},
    {**_LORA, "lora_vision_tower": "tower", "lora_dropout": 0.1},  # LLaMA-Factory's unfrozen tower
    {**_LORA, "batch": 2, "images": 1, "image_size": 448, "precision": "bf16"},
)
_EXCLUDED_CKPT = ({**_LORA, "seq": 100, "grad_ckpt": True, "lora_vision_tower": "excluded"},)
# a text-only step: get_peft_model adapts the tower all the same; its adapters get no gradient
_TEXT_STEP = {"method": "lora", "batch": 1, "seq": 64}
# Llama 4: all-linear less the text MoE's router, by name (Llama4Router subclasses nn.Linear and returns a
# tuple, so PEFT 0.21's all-linear wraps it and lora.Linear.forward fails reading the result's dtype): the
# language model's linears, the tower's attention (q/k/v/o_proj), MLPs and pixel-shuffle MLP (fc1, fc2) and
# patch embedding (linear), the projector's linear_1, each as far as the step's lora_vision_tower reaches
_LLAMA4_TEXT = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
_LLAMA4_TARGETS = {
    "excluded": _LLAMA4_TEXT,
    "tower": f"{_LLAMA4_TEXT},fc1,fc2,linear",
    "targets": f"{_LLAMA4_TEXT},fc1,fc2,linear,linear_1",
}


def _llama4(*steps: dict) -> tuple[dict, ...]:
    """The steps with Llama 4's targets for their lora_vision_tower."""
    return tuple({**r, "lora_targets": _LLAMA4_TARGETS[r.get("lora_vision_tower", "targets")]} for r in steps)


LORA_POINTS: dict[str, tuple[dict, ...]] = {
    "gemma3-vision-tiny": (*_LORA_STEPS, {**_LORA, "lora_targets": "q_proj,v_proj"}, _TEXT_STEP),
    "qwen2_5_vl-vision-tiny": (
        *_LORA_STEPS,
        *_EXCLUDED_CKPT,
        {**_LORA, "lora_targets": "re:.*visual.*qkv"},
        _TEXT_STEP,
        {**_TEXT_STEP, "lora_vision_tower": "tower", "grad_ckpt": True},
    ),
    "qwen3_vl-vision-tiny": (*_LORA_STEPS, _TEXT_STEP),
    "mistral3-vision-tiny": (*_LORA_STEPS, *_EXCLUDED_CKPT, _TEXT_STEP),
    "llama4-vision-tiny": _llama4(*_LORA_STEPS, *_EXCLUDED_CKPT, _TEXT_STEP),
}


def trace(python: str, key: str, run: dict, mode: str = "inference") -> dict:
    config = json.loads((HERE / "configs" / f"{key}.json").read_text())
    request = {"config": config, "mode": mode, "run": {"attn": "sdpa", **run}}
    env = {**os.environ, "PYTHONPATH": str(WORKER_PARENT)}
    proc = subprocess.run(
        [python, "-m", "gpumem_trace_worker"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    res = json.loads(proc.stdout)
    if "error" in res:
        raise SystemExit(f"{key} {run}: {res['error']}")
    keep = ("versions", "peak_bytes", "peak_phase", "notes", "image_tokens", "kv_cache_bytes", "phases")
    keep += ("trainable_params",)
    return {"model": key, "mode": mode, "run": request["run"], **{k: res[k] for k in keep if k in res}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the Python with torch and transformers")
    ap.add_argument("--only", help="one config key")
    ap.add_argument("--mode", choices=("inference", "train", "lora-tower"), default="inference")
    args = ap.parse_args()
    out, table = {
        "inference": (OUT, POINTS),
        "train": (TRAIN_OUT, TRAIN_POINTS),
        "lora-tower": (LORA_OUT, LORA_POINTS),
    }[args.mode]
    old = json.loads(out.read_text())["points"] if out.is_file() else []
    points = [p for p in old if args.only and p["model"] != args.only]
    for key, runs in table.items():
        if args.only and key != args.only:
            continue
        for run in runs:
            points.append(trace(args.python, key, run, "train" if args.mode == "lora-tower" else args.mode))
            print(key, run, points[-1]["peak_bytes"], flush=True)
    out.write_text(json.dumps({"points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
