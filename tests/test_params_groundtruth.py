"""Exact parameter and KV accounting against counts made by transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_transformers
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO, reference_dir


def _static_entries(ref: Path) -> list[tuple[Path, dict]]:
    gt = json.loads((ref / "groundtruth.json").read_text())
    return [
        (ref / "configs" / f"{name}.json", st) for name, st in gt["static"].items() if "total_params" in st
    ]


def _extra_entries() -> list[tuple[Path, dict]]:
    extra = REPO / "tests" / "reference" / "extra"
    f = extra / "groundtruth_extra.json"
    if not f.is_file():
        return []
    gt = json.loads(f.read_text())
    return [
        (extra / "configs" / f"{name}.json", st) for name, st in gt["static"].items() if "total_params" in st
    ]


CASES = _static_entries(reference_dir()) + _extra_entries()


@pytest.mark.parametrize(("config", "truth"), CASES, ids=[c.stem for c, _ in CASES])
def test_counts_equal_transformers(config: Path, truth: dict) -> None:
    spec = load_config_file(config)
    c = count_params(spec)
    # a tower's learned position table and a projector's embedding tables are nn.Embedding modules too
    v = spec.vision
    vision_pos = v.position_embedding_params + v.embedding_table_params if v else 0
    assert c.total == truth["total_params"]
    assert c.embedding == truth["input_embedding_params"]
    assert c.lm_head == truth["lm_head_params"]
    assert c.lm_head_tied == truth["lm_head_tied_to_input_embedding"]
    # Gemma 3n's embed_tokens_per_layer, an nn.Embedding counted under embedding_extra (spec/altup.py)
    per_layer = spec.altup.table_params * spec.num_layers if spec.altup else 0
    if spec.gemma4 is not None:  # Gemma 4's embed_tokens_per_layer (spec/gemma4.py)
        per_layer = spec.gemma4.per_layer_vocab_size * spec.num_layers * spec.gemma4.per_layer_input_size
    assert c.position_embedding + vision_pos + per_layer == truth["other_embedding_params"]
    assert c.routed_experts == truth["routed_expert_params"]
    if "active_params_per_token" in truth:
        assert c.active_per_token == truth["active_params_per_token"]
    if "text_only" in truth:
        assert c.text == truth["text_only"]["total_params"]
        assert c.vision == truth["total_params"] - truth["text_only"]["total_params"]
    assert sum(c.by_component.values()) == c.total
    assert spec.num_layers == truth["num_layers"]


@pytest.mark.parametrize(("config", "truth"), CASES, ids=[c.stem for c, _ in CASES])
def test_kv_bytes_equal_transformers(config: Path, truth: dict) -> None:
    spec = load_config_file(config)
    if not isinstance(truth.get("kv_cache_bytes_per_token_bf16"), int):
        pytest.skip(f"no KV measurement for {config.stem}: {truth.get('kv_cache_error', 'not measured')}")
    assert sum(kv_bytes_per_token_per_layer(spec)) == truth["kv_cache_bytes_per_token_bf16"]
    for tokens, measured in truth.get("kv_cache_measured", {}).items():
        assert list(kv_cache_bytes_transformers(spec, int(tokens))) == measured["per_layer_bytes"], tokens


def _per_layer_truth() -> list[tuple[str, list[int]]]:
    f = REPO / "tests" / "reference" / "extra" / "per_layer_params.json"
    return sorted(json.loads(f.read_text())["per_layer_params"].items())


@pytest.mark.parametrize(("name", "truth"), _per_layer_truth(), ids=[n for n, _ in _per_layer_truth()])
def test_per_layer_counts_equal_transformers(name: str, truth: list[int]) -> None:
    spec = load_config_file(REPO / "tests" / "reference" / "extra" / "configs" / f"{name}.json")
    assert list(count_params(spec).per_layer) == truth
