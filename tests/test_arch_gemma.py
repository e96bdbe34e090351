"""Issue 14, group gemma: Gemma 3n (gemma3n_text) read, counted and cached as transformers 5.24 builds it
(models/gemma3n/configuration_gemma3n.py Gemma3nTextConfig, modeling_gemma3n.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core import estimate_training, load_config_file, make_training_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.accounting import weight_bytes
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, tokens_kept_transformers
from gpumem_gui.core.spec.params import count_params, text_tensors
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
E2B = CONFIGS / "google__gemma-3n-E2B-text.json"
TINY = CONFIGS / "synthetic__gemma3n-tiny.json"


def _write(tmp_path: Path, base: Path, **over: object) -> Path:
    cfg = {**json.loads(base.read_text()), **over}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_e2b_shares_the_last_ten_layers_kv() -> None:
    spec = load_config_file(E2B)
    assert spec.kv_shared_layers == tuple(range(20, 30))
    per = kv_bytes_per_token_per_layer(spec)
    assert per[:20] == (2 * 2 * 256 * 2,) * 20 and per[20:] == (0,) * 10
    assert sum(per) == 40960  # transformers' DynamicCache: 'dummy' layers for the 10 shared ones
    assert tokens_kept_transformers(spec, 4096)[20:] == (0,) * 10
    assert tokens_kept_transformers(spec, 4096)[:5] == (511, 511, 511, 511, 4096)


def test_shared_layers_have_no_k_v_weights_and_the_table_is_counted() -> None:
    spec = load_config_file(E2B)
    names = {t.name for t in text_tensors(spec)}
    assert "layers.19.self_attn.k_proj.weight" in names and "layers.19.self_attn.k_norm.weight" in names
    assert (
        "layers.20.self_attn.k_proj.weight" not in names and "layers.20.self_attn.v_proj.weight" not in names
    )
    c = count_params(spec)
    table = 262_144 * 30 * 256  # embed_tokens_per_layer: vocab_size_per_layer_input x layers x 256
    assert c.by_component["embedding_extra"] == table + 30 * 256 * 2048 + 2 * 3 * 2048 * 2048
    assert c.total == 4_435_182_688  # groundtruth_extra.json (transformers on the meta device)


@pytest.mark.parametrize("config", [E2B, TINY])
def test_format_layout_counts_every_tensor(config: Path) -> None:
    """The weights of a format are sized per layer kind: shared and unshared layers differ."""
    spec = load_config_file(config)
    assert weight_bytes(spec, "bf16").total_bytes == 2 * count_params(spec).total


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_kv_shared_layers", 10),
        ("num_kv_shared_layers", 9),  # the unshared layers lose the full-attention type
        ("intermediate_size", [512] * 9 + [1024]),
        ("intermediate_size", [512] * 3),
        ("activation_sparsity_pattern", [0.95] * 3),
        ("activation_sparsity_pattern", [1.5] * 10),
        ("altup_active_idx", 4),
        ("laurel_rank", 0),
        ("hidden_size_per_layer_input", "wide"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(GpumemInputError) as e:
        load_config_file(_write(tmp_path, TINY, **{field: value}))
    msg = str(e.value)
    assert field in msg and "\n" not in msg


def test_defaults_are_the_e4b_geometry(tmp_path: Path) -> None:
    spec = load_config_file(_write_min(tmp_path))
    assert (spec.num_layers, spec.intermediate_size, spec.kv_shared_layers) == (
        35,
        16384,
        tuple(range(20, 35)),
    )
    assert spec.altup is not None and spec.altup.sparse_layers == tuple(range(10))


def _write_min(tmp_path: Path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "gemma3n_text"}))
    return p


def test_training_says_it_is_approximate() -> None:
    spec = load_config_file(TINY)
    est = estimate_training(spec, make_training_run(batch=1, seq=256))
    assert any("Gemma 3n training activations" in w for w in est.warnings)
