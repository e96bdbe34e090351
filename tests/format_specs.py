"""Model specs and format ids shared by the weight-format tests (tests/test_formats_*.py)."""

from __future__ import annotations

from pathlib import Path

from gpumem_gui.core.formats import list_weight_formats
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import text_tensors

CONFIGS = Path(__file__).parent / "reference" / "configs"
EXTRA = Path(__file__).parent / "reference" / "extra" / "configs"
ALL_CONFIGS = sorted(CONFIGS.glob("*.json")) + sorted(EXTRA.glob("*.json"))
FORMAT_IDS = [f.id for f in list_weight_formats()]


def config_spec(name: str) -> ModelSpec:
    return load_config_file(CONFIGS / f"{name}.json")


LLAMA31 = "meta-llama__Llama-3.1-8B"


def linear_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of every decoder-layer linear weight (attention and MLP) of a dense spec."""
    return [
        t.shape
        for t in text_tensors(spec)
        if t.component in ("attention", "mlp") and t.name.endswith(".weight") and len(t.shape) == 2
    ]
