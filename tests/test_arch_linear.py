"""Group linear of issue 14 (LFM2-MoE: LFM2's short convolutions beside MoE feed-forwards with a sigmoid,
expert-biased router; MiniMax's lightning attention; Kimi Linear's and Ling's (bailing_hybrid) Kimi Delta
Attention beside MLA): the readers against the config classes, the replays, and one-line errors naming the
field for bad values. The fixed state against transformers' cache is checked for every measured model by
tests/test_arch_hybrid.py (tests/reference/extra/recurrent_state.json); parameters by
tests/test_params_groundtruth.py; peaks by tests/test_replay.py."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward, replay_forward_direct
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import state_bytes_per_sequence
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"


def _cfg(name: str) -> dict:
    return json.loads((EXTRA / "configs" / f"{name}.json").read_text())


LFM2_MOE = _cfg("LiquidAI__LFM2-8B-A1B")
TINY = _cfg("synthetic__lfm2_moe-tiny")


def test_lfm2_moe_reader() -> None:
    spec = spec_from_config(LFM2_MOE, name="lfm2-moe")
    assert spec.layer_types.count("conv") == 18 and spec.layer_types[2] == "full_attention"
    assert spec.moe is not None and spec.moe.dense_layers == (0, 1) and spec.num_moe_layers == 22
    # Lfm2MoeMLP takes intermediate_size as given (no LFM2 2/3 adjustment)
    assert spec.intermediate_size == 7168 and spec.moe.expert_intermediate_size == 1792
    assert spec.short_conv is not None and spec.short_conv.kernel == 3 and spec.tie_word_embeddings
    assert spec.traits.router == "sigmoid_bias" and spec.traits.router_renormalize
    assert count_params(spec).total == 8_339_929_856
    # 18 conv layers x (hidden x kernel) bf16
    assert state_bytes_per_sequence(spec) == 18 * 2048 * 3 * 2


def test_router_without_expert_bias_takes_the_plain_top_k() -> None:
    spec = spec_from_config({**TINY, "use_expert_bias": False, "norm_topk_prob": False}, name="t")
    assert spec.traits.router == "sigmoid_topk" and not spec.traits.router_renormalize


@pytest.mark.parametrize(("b", "q", "past"), [(1, 1, 0), (2, 3, 0), (1, 1, 500), (2, 40, 7)])
def test_tape_equals_the_replay(b: int, q: int, past: int) -> None:
    for variant in (TINY, {**TINY, "use_expert_bias": False}):
        spec = spec_from_config(variant, name="tiny")
        cfg = ReplayConfig(
            batch=b, q=q, past=past, param_dt="bf16", attn="sdpa", logits_to_keep=1, weights_counted=False
        )
        assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layer_types", None),
        ("layer_types", ["conv"] * 3),
        ("layer_types", ["linear_attention"] * 24),
        ("num_experts_per_tok", 40),
        ("num_dense_layers", -1),
        ("use_expert_bias", "yes"),
        ("norm_topk_prob", 1),
        ("routed_scaling_factor", 0),
        ("conv_L_cache", 0),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**LFM2_MOE, field: value}, name="bad")
    assert field in str(e.value) and "\n" not in str(e.value)


MINIMAX = _cfg("MiniMaxAI__MiniMax-Text-01-hf")
MINIMAX_TINY = _cfg("synthetic__minimax-tiny")


def test_minimax_reader() -> None:
    spec = spec_from_config(MINIMAX, name="minimax")
    la = spec.linear_attention
    assert la is not None and la.kind == "lightning" and la.chunk_size == 256 and not la.conv_kernel
    assert spec.layer_types.count("linear_attention") == 70 and spec.layer_types[7] == "full_attention"
    assert spec.traits.block == "minimax" and spec.traits.router == "softmax_fp32_weights"
    assert spec.moe is not None and spec.num_moe_layers == 80 and spec.moe.expert_intermediate_size == 9216
    assert count_params(spec).total == 456_089_655_296
    # the K^T V sums: [64 heads, 128, 128] in the activation dtype (bf16) per lightning layer
    assert state_bytes_per_sequence(spec) == 70 * 64 * 128 * 128 * 2
    # MiniMaxConfig.__post_init__: full attention where (i + 1) is odd
    bare = spec_from_config({k: v for k, v in MINIMAX_TINY.items() if k != "layer_types"}, name="b")
    assert bare.layer_types == ("full_attention", "linear_attention") * 2


def test_lightning_decay_buffers_are_weights_dtype() -> None:
    from gpumem_gui.core.replay.buffers import buffers_bytes

    spec = spec_from_config(MINIMAX_TINY, name="t")
    rotary = 2 * 16 * 4  # inv_freq and original_inv_freq, fp32
    per_layer = 8 * (1 + 2 * 256 + 256 * 256)  # slope_rate, query/key decay, diagonal decay
    assert buffers_bytes(spec) == rotary + 2 * per_layer * 2
    assert buffers_bytes(spec, 4) == rotary + 2 * per_layer * 4


@pytest.mark.parametrize(("b", "q", "past"), [(1, 1, 0), (2, 3, 0), (1, 300, 0), (1, 1, 500), (2, 40, 7)])
def test_minimax_tape_equals_the_replay(b: int, q: int, past: int) -> None:
    spec = spec_from_config(MINIMAX_TINY, name="tiny")
    for attn in ("sdpa", "eager"):
        cfg = ReplayConfig(
            batch=b, q=q, past=past, param_dt="bf16", attn=attn, logits_to_keep=1, weights_counted=False
        )
        assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layer_types", ["conv"] * 80),
        ("layer_types", ["linear_attention"] * 3),
        ("num_experts_per_tok", 40),
        ("sliding_window", 4096),
        ("hidden_act", "gelu"),
        ("block_size", 0),
    ],
)
def test_minimax_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**MINIMAX, field: value}, name="bad")
    assert field in str(e.value) and "\n" not in str(e.value)


KIMI = _cfg("moonshotai__Kimi-Linear-48B-A3B-Instruct")
KIMI_TINY = _cfg("synthetic__kimi_linear-tiny")
LING = _cfg("defaults__bailing_hybrid")
LING_TINY = _cfg("synthetic__bailing_hybrid-tiny")
KDA_STATE = 4096 * 3 * 4 * 2 + 32 * 128 * 128 * 4  # bf16 conv state (q, k, v x kernel 4), fp32 [32, 128, 128]


def test_kimi_linear_reader() -> None:
    spec = spec_from_config(KIMI, name="kimi")
    la, ml = spec.linear_attention, spec.mla
    assert la is not None and la.kind == "kda" and la.kda_gates == "low_rank" and la.key_heads == 32
    # linear_attn_config.full_attn_layers, 1-based
    assert [i for i, t in enumerate(spec.layer_types) if t == "full_attention"] == [3, 7, 11, 15, 19, 23, 26]
    assert ml is not None and ml.q_lora_rank is None and not ml.head_gate
    assert spec.position_embedding == "none"  # KimiLinearModel deletes its rotary_emb
    assert (
        spec.moe is not None
        and spec.moe.dense_layers == (0,)
        and spec.moe.shared_expert_intermediate_size == 1024
    )
    assert spec.traits.router == "fp32"
    assert count_params(spec).total == 49_122_675_072  # transformers on the meta device
    assert state_bytes_per_sequence(spec) == 20 * KDA_STATE
    # KimiLinearConfig.__post_init__ without linear_attn_config's lists: full attention where i and i % 4 == 0
    lac = {k: v for k, v in KIMI_TINY["linear_attn_config"].items() if "layers" not in k}
    bare = spec_from_config({**KIMI_TINY, "linear_attn_config": lac}, name="b")
    assert bare.layer_types == ("linear_attention",) * 4


def test_bailing_hybrid_reader() -> None:
    spec = spec_from_config(LING, name="ling")
    la, ml = spec.linear_attention, spec.mla
    assert la is not None and la.kind == "kda" and la.kda_gates == "full_safe"
    assert spec.layer_types.count("full_attention") == 7 and spec.layer_types[5] == "full_attention"
    assert ml is not None and ml.head_gate and spec.traits.rope_interleaved
    assert spec.moe is not None and spec.moe.dense_layers == (0, 1) and spec.moe.num_experts == 512
    assert count_params(spec).total == 124_414_191_072  # transformers on the meta device
    assert state_bytes_per_sequence(spec) == 35 * KDA_STATE
    unsafe = spec_from_config({**LING_TINY, "kda_safe_gate": False}, name="u").linear_attention
    assert unsafe is not None and unsafe.kda_gates == "full"


@pytest.mark.parametrize(("b", "q", "past"), [(1, 1, 0), (2, 3, 0), (1, 130, 0), (1, 1, 500), (2, 40, 7)])
def test_kda_tape_equals_the_replay(b: int, q: int, past: int) -> None:
    for cfg_json in (KIMI_TINY, LING_TINY, {**LING_TINY, "kda_safe_gate": False}):
        spec = spec_from_config(cfg_json, name="tiny")
        for attn in ("sdpa", "eager"):
            cfg = ReplayConfig(
                batch=b, q=q, past=past, param_dt="bf16", attn=attn, logits_to_keep=1, weights_counted=False
            )
            assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


@pytest.mark.parametrize(
    ("cfg", "field", "value", "named"),
    [
        (KIMI, "layer_types", ["mamba"] * 27, "layer_types"),
        (KIMI, "linear_attn_config", [1, 2], "linear_attn_config"),
        (KIMI, "linear_attn_config", {"full_attn_layers": [0], "kda_layers": []}, "full_attn_layers"),
        (KIMI, "linear_attn_config", {"full_attn_layers": [1], "kda_layers": [2]}, "kda_layers"),
        (KIMI, "num_experts_per_token", 300, "num_experts_per_tok"),
        (KIMI, "hidden_act", "gelu", "hidden_act"),
        (KIMI, "mlp_layer_types", ["dense"], "mlp_layer_types"),
        (LING, "layer_types", ["linear_attention"] * 3, "layer_types"),
        (LING, "kv_lora_rank", 0, "kv_lora_rank"),
        (LING, "kda_safe_gate", "yes", "kda_safe_gate"),
        (LING, "short_conv_kernel_size", 0, "short_conv_kernel_size"),
    ],
)
def test_kda_bad_values_name_the_field(cfg: dict, field: str, value: object, named: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**cfg, field: value}, name="bad")
    assert named in str(e.value) and "\n" not in str(e.value)
