"""Exact parameter counts of encoder-decoder checkpoints (T5, mT5, UMT5) from transformers itself (run in the
tracing venv).

The ground-truth tool (``groundtruth.py``) builds ``AutoModelForCausalLM``, which has no mapping for these
types; here each config is built with ``AutoModelForSeq2SeqLM`` on the meta device and its ``parameters()``
(tied weights once), its input embedding and its buffers are counted, with every named tensor's shape. Writes
``tests/reference/seq2seq/params.json``::

    /tmp/gt-venv/bin/python validation/seq2seq_params.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIR = REPO / "tests" / "reference" / "seq2seq"


def count(config: dict) -> dict:
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForSeq2SeqLM.from_config(cfg)
    return {
        "class": type(model).__name__,
        "total": sum(p.numel() for p in model.parameters()),
        "embedding": model.get_input_embeddings().weight.numel(),
        "lm_head_tied": model.lm_head.weight is model.get_input_embeddings().weight,
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "tensors": {n: list(p.shape) for n, p in model.named_parameters()},
    }


def main() -> int:
    import transformers

    names = sys.argv[1:] or sorted(p.stem for p in (DIR / "configs").glob("*.json"))
    path = DIR / "params.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc["about"] = (
        f"transformers {transformers.__version__} AutoModelForSeq2SeqLM parameter counts on the meta device "
        "(validation/seq2seq_params.py)"
    )
    res = doc.setdefault("models", {})
    for name in names:
        config = json.loads((DIR / "configs" / f"{name}.json").read_text())
        res[name] = count(config)
        print(name, res[name]["total"], res[name]["lm_head_tied"], file=sys.stderr)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
