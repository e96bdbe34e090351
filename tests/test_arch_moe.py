"""Group moe of issue 14 (OLMoE, Phi-3.5-MoE, GLM-4.5, Hunyuan-A13B, ERNIE-4.5 MoE, dots.llm1, MiniMax-M2):
what each reader takes from a config, the traits the replay reads, the routers it replays op by op, and
one-line errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training import make_training_run, simulate_rank
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


OLMOE = _cfg("allenai__OLMoE-1B-7B-0924")
PHIMOE = _cfg("microsoft__Phi-3.5-MoE-instruct")
GLM45 = _cfg("zai-org__GLM-4.5")
AIR = _cfg("zai-org__GLM-4.5-Air")
HUNYUAN = _cfg("tencent__Hunyuan-A13B-Instruct")
ERNIE = _cfg("baidu__ERNIE-4.5-21B-A3B-PT")
DOTS = _cfg("rednote-hilab__dots.llm1.inst")
M2 = _cfg("MiniMaxAI__MiniMax-M2")


def _peaks(cfg: dict, q: int = 256) -> tuple[int, int]:
    """Replayed prefill peaks of ``cfg`` with its own router and with TopKRouter's softmax one."""
    spec = spec_from_config(cfg, name="m")
    plain = spec.model_copy(update={"traits": spec.traits.model_copy(update={"router": "softmax"})})
    run = ReplayConfig(batch=1, q=q, past=0, param_dt="bf16", attn="sdpa")
    return replay_forward(spec, run).peak, replay_forward(plain, run).peak


def test_olmoe_full_width_qk_norms_and_raw_top_k() -> None:
    spec = spec_from_config(OLMOE, name="olmoe")
    assert spec.qk_norm == "full_width" and spec.moe is not None and spec.moe.dense_layers == ()
    assert spec.moe.expert_intermediate_size == 1024 and not spec.traits.router_renormalize
    assert spec_from_config({**OLMOE, "norm_topk_prob": True}, name="o").traits.router_renormalize
    # OlmoeConfig's attribute_map: num_local_experts is the same field
    alias = {k: v for k, v in OLMOE.items() if k != "num_experts"} | {"num_local_experts": 64}
    assert count_params(spec_from_config(alias, name="o")).total == count_params(spec).total


def test_phimoe_layernorm_biases_and_sparsemixer() -> None:
    spec = spec_from_config(PHIMOE, name="phimoe")
    assert spec.norm == "layernorm" and spec.norm_bias and spec.lm_head_bias and spec.qkv_bias
    assert spec.traits.router == "sparsemixer"
    assert set(spec.layer_types) == {"sliding_attention"} and spec.sliding_window == 131072
    # the two masked softmaxes over [tokens, experts] logits cost more than the one softmax of TopKRouter
    tiny = {**PHIMOE, "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 256}
    tiny |= {"num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 512}
    own, softmax = _peaks(tiny)
    assert own != softmax


def test_input_jitter_saves_a_noise_tensor_per_multiplication_in_training() -> None:
    """PhimoeSparseMoeBlock and PhimoeTopKRouter each scale the MoE input in place by a noise tensor that
    MulBackward keeps: two [tokens, hidden] tensors per layer more at the end of the forward."""
    tiny = {**PHIMOE, "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 256}
    tiny |= {"num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4}
    assert spec_from_config(tiny, name="p").traits.moe_input_jitter == 2
    assert spec_from_config({**tiny, "input_jitter_noise": 0.0}, name="p").traits.moe_input_jitter == 0
    assert spec_from_config({**M2, "router_jitter_noise": 0.1}, name="m").traits.moe_input_jitter == 1
    run = make_training_run(batch=1, seq=64, precision="bf16", attn="sdpa")
    on = simulate_rank(spec_from_config(tiny, name="p"), run)[0].phases["forward"].total
    off = simulate_rank(spec_from_config({**tiny, "input_jitter_noise": 0.0}, name="p"), run)[0]
    # layers x noise tensors x tokens x hidden x bf16
    assert on - off.phases["forward"].total == 2 * 2 * 64 * 128 * 2


def test_glm4_moe_dense_prefix_partial_rotary_and_mtp_left_out() -> None:
    spec = spec_from_config(GLM45, name="glm")
    assert spec.moe is not None and spec.moe.dense_layers == (0, 1, 2)
    assert spec.moe.shared_expert_intermediate_size == 1536 and spec.rotary_dim == 64
    assert spec.qk_norm == "per_head" and spec.qkv_bias and not spec.o_bias
    assert spec.traits.router == "fp32"
    air = spec_from_config(AIR, name="air")
    assert air.qk_norm == "none" and air.moe is not None and air.moe.dense_layers == (0,)
    # num_nextn_predict_layers: the MTP layer is not built by Glm4MoeForCausalLM
    more = spec_from_config({**GLM45, "num_nextn_predict_layers": 3}, name="g")
    assert count_params(more).total == count_params(spec).total == 352_797_814_784


def test_hunyuan_per_layer_lists_read_as_one_value() -> None:
    spec = spec_from_config(HUNYUAN, name="hy")
    listed = spec_from_config({**HUNYUAN, "moe_topk": [8] * 32, "num_experts": [64] * 32}, name="hy")
    assert listed == spec.model_copy(update={"name": "hy"})
    assert spec.moe is not None and spec.moe.experts_per_token == 8
    assert spec.moe.shared_expert_intermediate_size == spec.moe.expert_intermediate_size == 3072
    assert spec.traits.qk_norm_after_rope and spec.traits.shared_expert_first and spec.tie_word_embeddings


def test_ernie_moe_layer_window_and_the_correction_bias_parameter() -> None:
    spec = spec_from_config(ERNIE, name="ernie")
    assert spec.moe is not None and spec.moe.dense_layers == (0,) and spec.moe.score_bias_param
    assert spec.moe.shared_expert_intermediate_size == 2 * 1536
    step = spec_from_config({**ERNIE, "moe_layer_interval": 2, "moe_layer_end_index": 20}, name="e")
    assert step.moe is not None
    assert [i for i in range(28) if step.is_moe_layer(i)] == list(range(1, 21, 2))
    assert spec.traits.router == "fp32_softmax" and spec.traits.rope_fp32
    assert spec.traits.attention_dropout == 0


def test_dots1_sliding_layers_from_max_window_layers() -> None:
    spec = spec_from_config(DOTS, name="dots")
    assert spec.layer_types == () and spec.sliding_window is None and spec.qk_norm == "per_head"
    slid = spec_from_config({**DOTS, "sliding_window": 4096, "max_window_layers": 60}, name="d")
    assert slid.layer_types == ("full_attention",) * 60 + ("sliding_attention",) * 2
    # Dots1Config defaults sliding_window to 4096 when the key is absent (and max_window_layers to 62)
    absent = spec_from_config({k: v for k, v in DOTS.items() if k != "sliding_window"}, name="d")
    assert absent.sliding_window is None


def test_minimax_m2_rotary_dim_and_sigmoid_router() -> None:
    spec = spec_from_config(M2, name="m2")
    assert spec.rotary_dim == 64 and spec.qk_norm == "full_width" and spec.traits.router == "sigmoid"
    factor = {k: v for k, v in M2.items() if k != "rotary_dim"} | {"partial_rotary_factor": 0.5}
    assert spec_from_config(factor, name="m2") == spec
    # sigmoid routing weights are fp32: the experts' weighted outputs are fp32 too
    tiny = {**M2, "hidden_size": 256, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 256}
    tiny |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rotary_dim": 16}
    tiny.pop("quantization_config")
    own, softmax = _peaks(tiny, q=2048)
    assert own > softmax


@pytest.mark.parametrize(
    ("cfg", "change", "field"),
    [
        (OLMOE, {"norm_topk_prob": "yes"}, "norm_topk_prob"),
        (OLMOE, {"num_experts_per_tok": 65}, "num_experts_per_tok"),
        (PHIMOE, {"num_experts_per_tok": 4}, "num_experts_per_tok"),
        (PHIMOE, {"lm_head_bias": 1}, "lm_head_bias"),
        (PHIMOE, {"input_jitter_noise": 1.5}, "input_jitter_noise"),
        (M2, {"router_jitter_noise": "high"}, "router_jitter_noise"),
        (GLM45, {"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        (GLM45, {"first_k_dense_replace": -1}, "first_k_dense_replace"),
        (GLM45, {"n_shared_experts": 1.5}, "n_shared_experts"),
        (HUNYUAN, {"moe_topk": [8] * 31 + [4]}, "moe_topk"),
        (HUNYUAN, {"moe_topk": 65}, "moe_topk"),
        (HUNYUAN, {"num_experts": "many"}, "num_experts"),
        (ERNIE, {"moe_k": 65}, "moe_k"),
        (ERNIE, {"moe_layer_end_index": -5}, "moe_layer_end_index"),
        (ERNIE, {"use_bias": "no"}, "use_bias"),
        (DOTS, {"n_routed_experts": None}, "n_routed_experts"),
        (DOTS, {"sliding_window": 4096, "max_window_layers": -2}, "max_window_layers"),
        (M2, {"rotary_dim": 63}, "rotary_dim"),
        (M2, {"num_local_experts": 0}, "num_local_experts"),
    ],
)
def test_bad_values_name_the_field(cfg: dict, change: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**cfg, **change}, name="bad")
    msg = str(e.value)
    assert field in msg and "\n" not in msg
