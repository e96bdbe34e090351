"""Static ground truth (parameters, KV cache) of the vision-language configs of issue 14's vlm group
(Qwen2.5-VL, Qwen3-VL, Llama 3.2 Vision) with the shared ``groundtruth.py`` (run in the tracing venv), its
model builder changed: a config whose text config has no causal-LM class of its own (Qwen2_5_VLTextConfig,
Qwen3VLTextConfig, MllamaTextConfig are not in ``AutoModelForCausalLM``'s mapping) builds the whole
``<Type>ForConditionalGeneration`` (``AutoModelForImageTextToText``): its vision tower and projector are
counted with the text model, as the checkpoint holds them. The tool's KV prefill passes the text config
alone: it is wrapped into its multimodal config (the class-default vision tower, unused by a text-only
forward) and run through the whole model with text only. The text-only count (``text_only``) is the whole
model's parameters under ``language_model`` and ``lm_head``.

    GT_CONFIG_DIR=tests/reference/extra/configs GT_OUT=/tmp/gt_vlm.json \\
        /tmp/gt-venv/bin/python validation/groundtruth_vlm.py synthetic__qwen2_5_vl-tiny ...
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from validation.validate_report.common import reference_dir  # noqa: E402

sys.path.insert(0, str(reference_dir() / "tools"))
import groundtruth as gt  # type: ignore[import-not-found]  # noqa: E402

NOTE = (
    "groundtruth.py static_for with the model built as <Type>ForConditionalGeneration "
    "(AutoModelForImageTextToText; validation/groundtruth_vlm.py)"
)
TEXT_OF = {
    "Qwen2_5_VLTextConfig": "Qwen2_5_VLConfig",
    "Qwen3VLTextConfig": "Qwen3VLConfig",
    "Qwen3VLMoeTextConfig": "Qwen3VLMoeConfig",
    "MllamaTextConfig": "MllamaConfig",
}
WHOLE = ("Qwen2_5_VLConfig", "Qwen3VLConfig", "Qwen3VLMoeConfig", "MllamaConfig")


def build_model(cfg: Any, dtype: Any, attn: str | None = "sdpa", moe_impl: str | None = None) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    if moe_impl:
        kw["experts_implementation"] = moe_impl
    name = type(cfg).__name__
    if name in TEXT_OF:  # the tool's KV prefill passes the text config: wrap it (class-default vision tower)
        import transformers

        cfg = getattr(transformers, TEXT_OF[name])(text_config=cfg.to_dict())
        name = type(cfg).__name__
    auto = AutoModelForImageTextToText if name in WHOLE else AutoModelForCausalLM
    return auto.from_config(copy.deepcopy(cfg), **kw)


def text_only(key: str) -> dict[str, Any]:
    """The parameters outside the vision tower and projector (the tool's own text-only count builds
    AutoModelForCausalLM from the text config, which these types do not have): the whole model on the meta
    device, its parameters under ``language_model`` and ``lm_head``."""
    import torch

    with torch.device("meta"):
        m = build_model(gt.load_config(key), torch.bfloat16)
    names = [n for n, _ in m.named_parameters()]
    n = sum(
        p.numel() for name, p in m.named_parameters() if {"language_model", "lm_head"} & set(name.split("."))
    )
    return {
        "total_params": n,
        "note": f"{type(m).__name__}: language_model + lm_head of {len(names)} tensors",
    }


def main(keys: list[str]) -> None:
    gt.build_model = build_model
    out: dict[str, Any] = {"static": {}}
    for key in keys:
        rec = gt.static_for(key)
        rec["measurement_note"] = NOTE
        if "skipped" in rec.get("text_only", {}):
            rec["text_only"] = text_only(key)
        out["static"][key] = rec
        print(key, rec.get("total_params"), rec.get("kv_cache_bytes_per_token_bf16"), file=sys.stderr)
    Path(os.environ["GT_OUT"]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
