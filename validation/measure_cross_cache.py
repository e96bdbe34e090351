"""Measured cross-attention cache of Llama 3.2 Vision (``mllama``) with images: a real forward of the tiny
synthetic config (CPU, random weights) with ``images`` images per sequence, then one decode step without
``pixel_values`` (``prepare_inputs_for_generation`` drops them after the first step; the cross-attention
layers read their cached keys and values). Writes the per-layer bytes of the DynamicCache after each step to
``tests/reference/extra/cross_cache_mllama.json``. Run in the tracing venv:

    /tmp/gt-venv/bin/python validation/measure_cross_cache.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KEY = "synthetic__mllama-tiny"
OUT = REPO / "tests" / "reference" / "extra" / "cross_cache_mllama.json"
POINTS = ((1, 1, 40), (2, 1, 33), (1, 2, 40), (2, 3, 17))  # (batch, images, prompt tokens)


def _layer_bytes(cache: Any) -> list[int]:
    out = []
    for layer in cache.layers:
        n = 0
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                n += t.numel() * t.element_size()
        out.append(int(n))
    return out


def measure(batch: int, images: int, seq: int) -> dict[str, Any]:
    import torch
    import transformers

    raw = json.loads((REPO / "tests" / "reference" / "extra" / "configs" / f"{KEY}.json").read_text())
    cfg = transformers.MllamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    torch.manual_seed(0)
    model = transformers.MllamaForConditionalGeneration(cfg).to(torch.bfloat16).eval()
    vc = cfg.vision_config
    tiles, side = vc.max_num_tiles, vc.image_size
    ids = torch.randint(3, cfg.text_config.vocab_size - 10, (batch, seq))
    ids[:, 0] = cfg.image_token_index
    with torch.no_grad():
        out = model(
            input_ids=ids,
            pixel_values=torch.randn(batch, images, tiles, 3, side, side, dtype=torch.bfloat16),
            aspect_ratio_ids=torch.ones(batch, images, dtype=torch.long),
            aspect_ratio_mask=torch.ones(batch, images, tiles, dtype=torch.long),
            cross_attention_mask=torch.ones(batch, seq, images, tiles, dtype=torch.long),
            use_cache=True,
        )
        prefill = _layer_bytes(out.cache)
        step = model(
            input_ids=ids[:, -1:],
            cross_attention_mask=torch.ones(batch, 1, images, tiles, dtype=torch.long),
            cache=out.cache,
            use_cache=True,
        )
        decode = _layer_bytes(step.cache)
    return {
        "batch": batch,
        "images": images,
        "seq": seq,
        "prefill_per_layer_bytes": prefill,
        "decode_per_layer_bytes": decode,
    }


def main() -> None:
    import torch
    import transformers

    points = [measure(*p) for p in POINTS]
    doc = {
        "about": "transformers' DynamicCache of MllamaForConditionalGeneration with images (bf16): per-layer "
        "bytes after the prefill and after one decode step; validation/measure_cross_cache.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": KEY,
        "points": points,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(points), file=sys.stderr)


if __name__ == "__main__":
    main()
