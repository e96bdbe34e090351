"""Static ground truth (parameters, KV cache) of Llama 4 configs with the shared ``groundtruth.py`` (run in
the tracing venv), its model builder changed in two ways:

* a ``Llama4Config`` builds ``Llama4ForConditionalGeneration`` (``AutoModelForImageTextToText``): the tool's
  ``AutoModelForCausalLM`` maps ``llama4`` to the text-only ``Llama4ForCausalLM`` and would drop the vision
  tower and projector the checkpoint holds (the text-only count is still recorded, as ``text_only``);
* no ``experts_implementation``: ``Llama4TextExperts`` supports none, ``from_config`` raises, and the tool's
  retry reuses the config the failed call already changed, so its KV measurement fails.

Everything else (counting, the KV cache measured from a text-only prefill under FakeTensorMode) is the tool's
own ``static_for``. Writes ``$GT_OUT`` in the tool's format, merged into
``tests/reference/extra/groundtruth_extra.json``::

    GT_CONFIG_DIR=tests/reference/extra/configs GT_OUT=/tmp/gt_llama4.json \\
        /tmp/gt-venv/bin/python validation/groundtruth_llama4.py synthetic__llama4-tiny ...
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
    "groundtruth.py static_for with the model built as Llama4ForConditionalGeneration "
    "(AutoModelForImageTextToText) and without experts_implementation (validation/groundtruth_llama4.py)"
)


def build_model(cfg: Any, dtype: Any, attn: str | None = "sdpa", moe_impl: str | None = None) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    kw: dict[str, Any] = {"dtype": dtype}
    if attn:
        kw["attn_implementation"] = attn
    if type(cfg).__name__ == "Llama4Config":
        return AutoModelForImageTextToText.from_config(copy.deepcopy(cfg), **kw)
    return AutoModelForCausalLM.from_config(copy.deepcopy(cfg), **kw)


def main(keys: list[str]) -> None:
    gt.build_model = build_model
    out: dict[str, Any] = {"static": {}}
    for key in keys:
        rec = gt.static_for(key)
        rec["measurement_note"] = NOTE
        out["static"][key] = rec
        print(key, rec.get("total_params"), rec.get("kv_cache_bytes_per_token_bf16"), file=sys.stderr)
    Path(os.environ["GT_OUT"]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
