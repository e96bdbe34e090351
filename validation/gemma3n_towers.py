"""Measure the towers of the multimodal Gemma 3n checkpoints (issue 14): build
Gemma3nForConditionalGeneration on the meta device from each reference config and count its parameters per
top-level module (language model, vision tower, audio tower, the two embedders), and count every timm vision
architecture ``readers/hf_new_gemma3n.TIMM_TOWER_PARAMS`` names with ``timm.create_model(name,
num_classes=0)`` (what TimmWrapperModel builds). Writes ``tests/reference/extra/gemma3n_towers.json``.

The vision tower is a timm model, and timm imports torchvision; PyPI's torchvision does not load beside the
CPU build of torch 2.13 ("operator torchvision::nms does not exist": its C++ operators are built for the CUDA
build). Nothing here uses torchvision's operators, so its meta registrations are skipped (a stand-in module)
before timm is imported; the models are built on the meta device and nothing is computed.

Environment (a scratch venv beside the ground-truth one):
    python3 -m venv /tmp/timm-venv
    /tmp/timm-venv/bin/pip install torch==2.13.0 transformers==5.24.0 accelerate==1.15.0 safetensors
    /tmp/timm-venv/bin/pip install --no-deps torchvision==0.28.0 timm==1.0.31
    /tmp/timm-venv/bin/python validation/gemma3n_towers.py google__gemma-3n-E2B-it google__gemma-3n-E4B-it

The static ground truth of the same configs (tests/reference/extra/groundtruth_extra.json) comes from the
unchanged ``groundtruth.py static`` run in that venv with the same stand-in, e.g. a ``sitecustomize.py`` on
PYTHONPATH holding the two lines of :func:`_skip_torchvision_meta_registrations`.
"""

from __future__ import annotations

import json
import sys
import types
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
OUT = REPO / "tests" / "reference" / "extra" / "gemma3n_towers.json"


def _skip_torchvision_meta_registrations() -> None:
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")


def main(keys: list[str]) -> int:
    _skip_torchvision_meta_registrations()
    import timm
    import torch
    import transformers
    from transformers import Gemma3nConfig, Gemma3nForConditionalGeneration

    sys.path.insert(0, str(REPO))
    from gpumem_gui.core.readers.hf_new_gemma3n import TIMM_TOWER_PARAMS

    out: dict = {
        "about": "Gemma 3n towers counted on the meta device (validation/gemma3n_towers.py)",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "timm": timm.__version__,
        },
        "timm_towers": {},
        "models": {},
    }
    for arch in TIMM_TOWER_PARAMS:
        with torch.device("meta"):
            tower = timm.create_model(arch, pretrained=False, num_classes=0)
        out["timm_towers"][arch] = sum(p.numel() for p in tower.parameters())
    for key in keys:
        raw = json.loads((CONFIGS / f"{key}.json").read_text())
        cfg = Gemma3nConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
        with torch.device("meta"):
            model = Gemma3nForConditionalGeneration(cfg)
        parts: Counter[str] = Counter()
        for name, p in model.named_parameters():
            head = name.split(".")
            parts[".".join(head[:2]) if head[0] == "model" else head[0]] += p.numel()
        out["models"][key] = {"total_params": sum(parts.values()), "by_module": dict(sorted(parts.items()))}
        print(key, out["models"][key]["total_params"], flush=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["google__gemma-3n-E2B-it", "google__gemma-3n-E4B-it"]))
