"""Measure the fixed per-sequence state transformers' cache keeps in linear-attention layers (issue 14).

Builds each reference config's model under ``FakeTensorMode`` (no memory, no compute), runs one prefill with
``use_cache=True`` and reads every cache layer's tensors: the attention layers' keys and values, the
linear-attention layers' ``conv_states`` and ``recurrent_states`` (``cache_utils.py``
``LinearAttentionLayer``), with their shapes and dtypes. The state does not depend on the prompt length (two
lengths are measured to show it); its bytes per sequence are what ``gpumem_gui.core.spec.state`` must give.

Run with the ground-truth environment (torch 2.13 CPU, transformers 5.24):
``/tmp/gt-venv/bin/python validation/measure_recurrent_state.py <config key> ... > tests/reference/extra/
recurrent_state.json`` (``--merge tests/reference/extra/recurrent_state.json <key> ...`` adds or replaces
those keys only); keys are ``tests/reference/extra/configs/<key>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "reference" / "extra" / "configs"
SEQS = (16, 200)


def _tensors(layer: Any, attr: str) -> list[Any]:
    import torch

    v = getattr(layer, attr, None)
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, dict):
        return [t for t in v.values() if isinstance(t, torch.Tensor)]
    return []


def _layer(layer: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"class": type(layer).__name__}
    for attr in ("keys", "values", "conv_states", "recurrent_states"):
        ts = _tensors(layer, attr)
        if ts:
            rec[attr] = {
                "shapes": [list(t.shape) for t in ts],
                "dtype": str(ts[0].dtype).replace("torch.", ""),
                "bytes": sum(t.numel() * t.element_size() for t in ts),
            }
    return rec


def measure(key: str, batch: int = 1) -> dict[str, Any]:
    import torch
    import transformers.masking_utils as mu
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForCausalLM

    mu.find_packed_sequence_indices = lambda position_ids: None  # fakes cannot be read (groundtruth.py)
    raw = json.loads((CONFIGS / f"{key}.json").read_text())
    cfg = AutoConfig.for_model(**raw)
    out: dict[str, Any] = {"model_type": raw.get("model_type"), "batch": batch}
    for seq in SEQS:
        with FakeTensorMode():
            kw: dict[str, Any] = {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
            try:  # grouped_mm experts: the eager expert loop cannot run on fakes (groundtruth.py build_model)
                model = AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm", **kw)
            except ValueError:  # a model without experts (the failed call marked the config: a fresh one)
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**raw), **kw)
            model.eval()
            with torch.no_grad():
                res = model(
                    input_ids=torch.zeros((batch, seq), dtype=torch.long), use_cache=True, logits_to_keep=1
                )
            cache = getattr(res, "past_key_values", None) or res.cache
            layers = [_layer(lay) for lay in cache.layers]
            for i, st in enumerate(getattr(cache, "linear_cache", [])):  # MiniMaxCache: lightning KV sums
                if isinstance(st, torch.Tensor):
                    layers[i]["recurrent_states"] = {
                        "shapes": [list(st.shape)],
                        "dtype": str(st.dtype).replace("torch.", ""),
                        "bytes": st.numel() * st.element_size(),
                    }
        state = [
            sum(v["bytes"] for k, v in lay.items() if k in ("conv_states", "recurrent_states"))
            for lay in layers
        ]
        kv = [sum(v["bytes"] for k, v in lay.items() if k in ("keys", "values")) for lay in layers]
        out[str(seq)] = {
            "state_bytes_per_layer": [s // batch for s in state],
            "state_bytes_per_sequence": sum(state) // batch,
            "kv_bytes_per_layer": kv,
            "layers": layers,
        }
    return out


def main(argv: list[str]) -> int:
    import torch
    import transformers

    if argv[:1] == ["--merge"]:  # --merge FILE KEY ...: measure KEYs and update FILE's entries in place
        path, keys = Path(argv[1]), argv[2:]
        old = json.loads(path.read_text())
        old["models"].update({k: measure(k) for k in keys})
        path.write_text(json.dumps(old, indent=1) + "\n")
        return 0
    res = {
        "about": "Fixed state per sequence of linear-attention layers, read from transformers' cache after a "
        "bf16 prefill under FakeTensorMode (validation/measure_recurrent_state.py). Bytes.",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "models": {k: measure(k) for k in argv},
    }
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
