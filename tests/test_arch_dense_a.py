"""Group dense_a of issue 14 (SmolLM3, OLMo 3, EXAONE 4.0, Arcee AFM, Apertus, Command R7B / A): what each
reader takes from a config, the traits the replay reads, the activations it replays op by op, and one-line
errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig, last_of_each_kind
from gpumem_gui.core.replay.forward import replay_forward
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


SMOL = _cfg("HuggingFaceTB__SmolLM3-3B")
OLMO3 = _cfg("allenai__Olmo-3-1025-7B")
EXAONE = _cfg("LGAI-EXAONE__EXAONE-4.0-32B")
AFM = _cfg("arcee-ai__AFM-4.5B")
APERTUS = _cfg("swiss-ai__Apertus-8B-2509")
R7B = _cfg("CohereLabs__c4ai-command-r7b-12-2024")
GPTJ = _cfg("EleutherAI__gpt-j-6b")


def _peak(spec: ModelSpec, keep: int = 1, attn: str = "sdpa") -> int:
    cfg = ReplayConfig(batch=1, q=256, past=0, param_dt="bf16", attn=attn, logits_to_keep=keep)
    return replay_forward(spec, cfg).peak


def test_smollm3_nope_layers_from_the_list_or_the_interval() -> None:
    spec = spec_from_config(SMOL, name="smol")
    assert spec.nope_layers == tuple(range(3, 36, 4)) and spec.tie_word_embeddings
    assert spec.layer_types == ()  # use_sliding_window false
    bare = {k: v for k, v in SMOL.items() if k != "no_rope_layers"}
    assert spec_from_config({**bare, "no_rope_layer_interval": 3}, name="s").nope_layers == tuple(
        range(2, 36, 3)
    )
    # the NoPE layers are a layer kind of their own: the inference replay runs one of each
    assert len(last_of_each_kind(spec).segments) == 2


def test_a_nope_layer_skips_the_rotary_temporaries() -> None:
    # projections much wider than the residual stream: the rotary's temporaries hold the layer's peak
    narrow = {"hidden_size": 256, "head_dim": 128, "num_key_value_heads": 16, "vocab_size": 1000}
    one = {"intermediate_size": 64, "num_hidden_layers": 1, "no_rope_layers": [0]}
    spec = spec_from_config({**SMOL, **narrow, **one}, name="n")
    rope = spec.model_copy(update={"nope_layers": ()})
    assert _peak(spec) < _peak(rope)


def test_olmo3_and_exaone4_layer_patterns() -> None:
    olmo = spec_from_config(OLMO3, name="o")
    assert olmo.traits.norm_placement == "post" and olmo.qk_norm == "full_width"
    assert olmo.layer_types[:4] == ("sliding_attention",) * 3 + ("full_attention",)
    assert olmo.sliding_window == 4096 and olmo.nope_layers == ()
    ex = spec_from_config(EXAONE, name="e")
    assert ex.traits.norm_placement == "post" and ex.qk_norm == "per_head"
    assert ex.nope_layers == tuple(range(3, 64, 4))  # global layers skip the rotary
    assert ex.nope_layers == tuple(i for i, t in enumerate(ex.layer_types) if t == "full_attention")
    bare = {k: v for k, v in EXAONE.items() if k != "layer_types"}
    assert spec_from_config(bare, name="e").layer_types == ex.layer_types  # "LLLG"
    assert spec_from_config({**bare, "sliding_window_pattern": 2}, name="e").layer_types[:2] == (
        "sliding_attention",
        "full_attention",
    )
    small = spec_from_config(_cfg("LGAI-EXAONE__EXAONE-4.0-1.2B"), name="s")
    assert small.layer_types == () and small.nope_layers == () and small.tie_word_embeddings


def test_relu2_and_xielu_are_replayed_not_a_stand_in() -> None:
    afm = spec_from_config({**AFM, "num_hidden_layers": 1}, name="a")
    assert not afm.mlp_gated and afm.activation == "relu2"
    assert _peak(afm) != _peak(afm.model_copy(update={"activation": "gelu_pytorch_tanh"}))
    ap = spec_from_config({**APERTUS, "num_hidden_layers": 1}, name="ap")
    assert ap.activation == "xielu" and ap.qk_norm == "per_head" and not ap.mlp_gated
    # xIELU's python path keeps the condition, both branches and their temporaries: a higher peak
    assert _peak(ap) > _peak(ap.model_copy(update={"activation": "silu"}))
    # XIELUActivation carries alpha_p and alpha_n ([1] each) in every MLP
    with_alpha = count_params(spec_from_config(APERTUS, name="ap")).total
    assert (
        with_alpha - count_params(spec_from_config({**APERTUS, "hidden_act": "relu2"}, name="r")).total == 64
    )


def test_cohere2_parallel_block_nope_globals_and_scaled_logits() -> None:
    spec = spec_from_config(R7B, name="c")
    assert spec.parallel_attn_mlp and spec.norms_per_layer == 1 and spec.norm == "layernorm"
    assert not spec.norm_bias and spec.tie_word_embeddings and spec.head_dim == 128
    assert spec.nope_layers == tuple(range(3, 32, 4))
    t = spec.traits
    assert t.layernorm_ops and t.rope_upcast and t.logits_scaled
    # head_dim is always hidden / heads (Cohere2Config.__post_init__)
    assert spec_from_config({**R7B, "head_dim": 64}, name="c").head_dim == 128
    small = spec_from_config({**R7B, "num_hidden_layers": 2}, name="c")
    plain = small.model_copy(update={"traits": t.model_copy(update={"logits_scaled": False})})
    assert _peak(small, keep=0) > _peak(plain, keep=0)  # logits * logit_scale: a second logits tensor


def test_gptj_partial_interleaved_rotary_and_fp32_eager_scores() -> None:
    spec = spec_from_config(GPTJ, name="j")
    assert (spec.head_dim, spec.rotary_dim, spec.intermediate_size) == (256, 64, 16384)
    assert spec.parallel_attn_mlp and spec.norms_per_layer == 1 and spec.norm_bias
    assert spec.lm_head_bias and not spec.tie_word_embeddings and spec.mlp_bias and not spec.qkv_bias
    assert spec.traits.rope_interleaved and spec.traits.attention_code == "gptj"
    assert dict(spec.traits.module_names)["up_proj"] == "fc_in"
    one = spec_from_config({**GPTJ, "n_layer": 1, "n_inner": 64, "vocab_size": 1000}, name="j")
    bf16_scores = one.model_copy(
        update={"traits": one.traits.model_copy(update={"attention_code": "shared"})}
    )
    assert _peak(one, attn="eager") > _peak(bf16_scores, attn="eager")  # fp32 q, k, scores and softmax
    assert spec_from_config({**GPTJ, "rotary_dim": 256}, name="j").rotary_dim is None  # the whole head


@pytest.mark.parametrize(
    ("cfg", "patch", "field"),
    [
        (SMOL, {"no_rope_layers": [1, 2]}, "no_rope_layers"),
        (SMOL, {"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
        (SMOL, {"use_sliding_window": "yes"}, "use_sliding_window"),
        (OLMO3, {"layer_types": ["full_attention"]}, "layer_types"),
        (OLMO3, {"hidden_act": "quick_gelu"}, "hidden_act"),
        (EXAONE, {"layer_types": None, "sliding_window_pattern": "LLXG"}, "sliding_window_pattern"),
        (EXAONE, {"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
        (AFM, {"hidden_act": "relu3"}, "hidden_act"),
        (AFM, {"mlp_bias": 1}, "mlp_bias"),
        (APERTUS, {"num_key_value_heads": 0}, "num_key_value_heads"),
        (R7B, {"logit_scale": -1}, "logit_scale"),
        (R7B, {"sliding_window_pattern": "4"}, "sliding_window_pattern"),
        (GPTJ, {"rotary_dim": 65}, "rotary_dim"),
        (GPTJ, {"rotary_dim": 512}, "rotary_dim"),
        (GPTJ, {"n_head": 3}, "num_attention_heads"),
        (GPTJ, {"activation_function": "gelu_fast"}, "activation_function"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_field(cfg: dict, patch: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as ei:
        spec_from_config({**cfg, **patch}, name="bad")
    msg = str(ei.value)
    assert field in msg and "\n" not in msg
