"""Llama 4 (llama4, llama4_text): what the readers take from Llama4Config / Llama4TextConfig and what the
replay and the KV accounting do with it (models/llama4/*, cache_utils.py, transformers 5.24)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.kv import kv_cache_bytes_transformers, tokens_kept_transformers
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
SCOUT = CONFIGS / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"
MAVERICK = CONFIGS / "meta-llama__Llama-4-Maverick-17B-128E-Instruct.json"
TINY = CONFIGS / "synthetic__llama4-tiny.json"


def _cfg(path: Path) -> dict:
    return json.loads(path.read_text())


def _spec(cfg: dict):
    return spec_from_config(cfg, name="t", source="config.json")


def test_scout_layout() -> None:
    spec = _spec(_cfg(SCOUT))
    assert spec.nope_layers == tuple(range(3, 48, 4))
    # chunked on the rotary layers, full attention on the NoPE ones (Llama4TextConfig.__post_init__)
    assert spec.layer_types == tuple(
        "full_attention" if i % 4 == 3 else "chunked_attention" for i in range(48)
    )
    assert spec.attention_chunk_size == 8192
    assert spec.qk_norm == "l2" and spec.traits.attn_temperature_tuning and spec.traits.rope_complex
    assert spec.moe is not None and spec.num_moe_layers == 48
    assert spec.moe.shared_expert_intermediate_size == spec.moe.expert_intermediate_size == 8192
    assert spec.vision is not None and spec.vision.image_tokens == 144  # (336/14)^2 / 4 per tile


def test_maverick_interleaves_dense_and_moe_layers() -> None:
    spec = _spec(_cfg(MAVERICK))
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert spec.intermediate_size == 16384  # intermediate_size_mlp: the dense layers' width
    assert spec.qk_norm == "none"
    per_layer = count_params(spec).per_layer
    # dense: 3 x 5120 x 16384; MoE: 128 experts + the shared expert of 3 x 5120 x 8192, router 5120 x 128
    attn_norms = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 2 * 5120
    assert per_layer[0] == attn_norms + 3 * 5120 * 16384
    assert per_layer[1] == attn_norms + 129 * 3 * 5120 * 8192 + 5120 * 128


def test_chunked_layers_keep_chunk_minus_one_tokens() -> None:
    """DynamicSlidingWindowLayer(sliding_window=attention_chunk_size) on chunked layers."""
    spec = _spec(_cfg(SCOUT))
    kept = tokens_kept_transformers(spec, 100_000)
    assert kept[0] == 8191 and kept[3] == 100_000
    assert kv_cache_bytes_transformers(spec, 10)[0] == 10 * 2 * 8 * 128 * 2


def test_text_only_config_reads_like_the_wrapped_one() -> None:
    wrapped = _spec(_cfg(TINY))
    text = _spec(_cfg(TINY)["text_config"])
    assert count_params(text).total == count_params(wrapped).text
    assert text.vision is None and wrapped.vision is not None


def test_explicit_moe_layers_and_rope_flags() -> None:
    cfg = _cfg(TINY)["text_config"] | {"moe_layers": [0], "no_rope_layers": [1, 0, 1, 1]}
    spec = _spec(cfg)
    assert spec.moe is not None and spec.moe.dense_layers == (1, 2, 3)
    assert spec.nope_layers == (1,) and spec.layer_types[1] == "full_attention"


def test_no_chunk_size_means_full_attention() -> None:
    spec = _spec(_cfg(TINY)["text_config"] | {"attention_chunk_size": None})
    assert set(spec.resolved_layer_types) == {"full_attention"} and spec.attention_chunk_size is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("no_rope_layers", [1, 2, 1, 1]),
        ("no_rope_layers", [1, 1]),
        ("moe_layers", [7]),
        ("interleave_moe_layer_step", 0),
        ("attention_chunk_size", -1),
        ("layer_types", ["sliding_attention"] * 4),
        ("attn_temperature_tuning", "4"),
        ("use_qk_norm", "yes"),
        ("num_experts_per_tok", 9),
        ("intermediate_size_mlp", 0),
    ],
)
def test_bad_text_fields_name_the_field(field: str, value: object) -> None:
    cfg = _cfg(TINY)
    cfg["text_config"] = cfg["text_config"] | {field: value}
    with pytest.raises(GpumemInputError) as e:
        _spec(cfg)
    msg = str(e.value)
    assert field in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("field", "value"), [("pixel_shuffle_ratio", 0), ("patch_size", "14"), ("hidden_size", 0)]
)
def test_bad_vision_fields_name_the_field(field: str, value: object) -> None:
    cfg = _cfg(TINY)
    cfg["vision_config"] = cfg["vision_config"] | {field: value}
    with pytest.raises(GpumemInputError) as e:
        _spec(cfg)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_chunked_layers_get_a_mask_once_the_keys_reach_the_chunk() -> None:
    """create_chunked_causal_mask with sdpa: None (is_causal) below the chunk, a boolean mask from it on."""
    from gpumem_gui.core.replay.autograd import Sim
    from gpumem_gui.core.replay.chunked import chunked_mask
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.model import CausalLM

    spec = _spec(_cfg(TINY))  # attention_chunk_size 256
    sim = Sim()
    sim.grad_enabled = False

    def mask(q: int, past: int = 0, attn: str = "sdpa"):
        cfg = ReplayConfig(batch=2, q=q, past=past, param_dt="bf16", attn=attn, weights_counted=False)
        return chunked_mask(CausalLM(sim, spec, cfg), "bf16")

    assert mask(255) is None
    assert mask(256).n == 2 * 256 * 256 and mask(256).dt == "bool"
    assert mask(1, past=1000).n == 2 * 1 * 256  # chunk - 1 cached + the new token
    assert mask(1, past=100) is None
    assert mask(8, attn="eager").dt == "bf16"


def test_the_integer_temperature_flag_of_meta_configs_reads_as_true() -> None:
    """Meta's configs say ``"attn_temperature_tuning": 4`` (transformers 4.5x: truthy; 5.24 refuses it)."""
    cfg = _cfg(TINY)
    cfg["text_config"] = cfg["text_config"] | {"attn_temperature_tuning": 4}
    assert _spec(cfg).traits.attn_temperature_tuning
    cfg["text_config"] = cfg["text_config"] | {"attn_temperature_tuning": 0}
    assert not _spec(cfg).traits.attn_temperature_tuning
