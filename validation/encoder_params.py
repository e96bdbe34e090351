"""Exact parameter counts of encoder checkpoints per head, from transformers itself (run in the tracing venv).

The ground-truth tool (``groundtruth.py``) builds ``AutoModelForCausalLM``; an encoder is built here with the
Auto class of each head (``AutoModelForSequenceClassification``, ``AutoModelForTokenClassification``,
``AutoModelForMaskedLM``) on the meta device, and its ``parameters()`` (tied weights once), buffers and PEFT's
LoRA ``all-linear`` adapters (r = 8, the task type of the head) are counted. Writes
``tests/reference/encoders/params.json``::

    /tmp/gt-venv/bin/python validation/encoder_params.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIR = REPO / "tests" / "reference" / "encoders"
HEADS = {
    "sequence_classification": ("AutoModelForSequenceClassification", "SEQ_CLS"),
    "token_classification": ("AutoModelForTokenClassification", "TOKEN_CLS"),
    "masked_lm": ("AutoModelForMaskedLM", None),
}


def count(config: dict, head: str) -> dict:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    cfg = transformers.AutoConfig.for_model(**config)
    auto, task = HEADS[head]
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(cfg)
    out = {
        "total": sum(p.numel() for p in model.parameters()),
        "embedding": model.get_input_embeddings().weight.numel(),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "tensors": {n: list(p.shape) for n, p in model.named_parameters()},
    }
    conf = LoraConfig(r=8, target_modules="all-linear", task_type=task)
    try:
        with torch.device("meta"):
            peft_model = get_peft_model(model, conf)
    except TypeError as e:  # TOKEN_CLS: all-linear wraps the classifier, which modules_to_save then refuses
        out["lora_error"] = str(e).splitlines()[0]
        return out
    out["lora_total"] = sum(p.numel() for p in peft_model.parameters())
    out["lora_trainable"] = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    out["lora_modules"] = sorted(
        {n.split(".")[-4] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    )
    return out


def main() -> int:
    names = sys.argv[1:] or sorted(p.stem for p in (DIR / "configs").glob("*.json"))
    doc = {"about": "transformers 5.24 + peft parameter counts per head (validation/encoder_params.py)"}
    res = {}
    for name in names:
        config = json.loads((DIR / "configs" / f"{name}.json").read_text())
        res[name] = {head: count(config, head) for head in HEADS}
        print(name, {h: v["total"] for h, v in res[name].items()}, file=sys.stderr)
    doc["models"] = res
    (DIR / "params.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
