"""llama.cpp GGUF formats and mixes: bits per weight against published figures, per-tensor types."""

from __future__ import annotations

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import gguf_plan, weight_bytes
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from tests.format_specs import LLAMA31, config_spec


@pytest.fixture(scope="module")
def llama31() -> ModelSpec:
    return config_spec(LLAMA31)


# ---- GGUF -----------------------------------------------------------------------------------------------

# tools/quantize/README.md (ggml-org/llama.cpp @311c2c9), table "meta-llama/Llama-3.1-8B": bits/weight.
README_LLAMA31_BPW = {
    "Q2_K_S": 2.9697,
    "Q2_K": 3.1593,
    "Q3_K_S": 3.6429,
    "Q3_K_L": 4.2979,
    "Q4_K_S": 4.6672,
    "Q4_K_M": 4.8944,
    "Q5_K_S": 5.5704,
    "Q5_K_M": 5.7036,
    "Q6_K": 6.5633,
    "Q8_0": 8.5008,
    "F16": 16.0005,
    "IQ4_XS": 4.4597,
    "IQ4_NL": 4.6818,
    "IQ3_M": 3.7628,
    "IQ3_S": 3.6606,
    "IQ3_XS": 3.4977,
    "IQ3_XXS": 3.2548,
    "IQ2_M": 2.9294,
    "IQ2_S": 2.7403,
    "IQ2_XS": 2.5882,
    "IQ2_XXS": 2.3824,
    "IQ1_M": 2.1460,
    "IQ1_S": 2.0042,
}


@pytest.mark.parametrize("mix", sorted(README_LLAMA31_BPW))
def test_gguf_mixes_match_llamacpp_readme(llama31: ModelSpec, mix: str) -> None:
    wb = weight_bytes(llama31, f"gguf-{mix}")
    # the README divides by the file's elements, which add a 64-float rope_freqs table to the parameters
    assert wb.bits_per_param == pytest.approx(README_LLAMA31_BPW[mix], rel=1e-3)


def test_gguf_q4_k_m_llama3_8b() -> None:
    # llama.cpp quantize README (@c392e50, 2025-02): Meta-Llama-3-8B Q4_K_M 4.58 GiB, 4.89 bpw
    wb = weight_bytes(config_spec("meta-llama__Meta-Llama-3-8B"), "gguf-Q4_K_M")
    assert wb.bits_per_param == pytest.approx(4.89, rel=0.02)
    assert wb.total_bytes / 2**30 == pytest.approx(4.58, rel=0.02)


def test_gguf_q4_k_m_llama2_7b_published_log() -> None:
    # llamafile server log (shared/reference/published: inf-llamacpp-llama2-7b-q4_k_m):
    # "model size = 3.80 GiB (4.84 BPW)"
    wb = weight_bytes(config_spec("meta-llama__Llama-2-7b-hf"), "gguf-Q4_K_M")
    assert wb.total_bytes / 2**30 == pytest.approx(3.80, abs=0.01)
    assert wb.bits_per_param == pytest.approx(4.84, abs=0.01)


def test_gguf_q8_0_is_8_5_bits(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "gguf-Q8_0")
    assert wb.quantized_bits_per_param == 8.5
    assert wb.by_storage.keys() == {"Q8_0", "F32"}
    assert wb.by_storage["F32"] == 4 * count_params(llama31).by_component["norms"]


def test_gguf_q4_k_m_tensor_types(llama31: ModelSpec) -> None:
    plan = {g.name: g for g in gguf_plan(llama31, "gguf-Q4_K_M")}
    assert plan["output.weight"].ggml_type == "Q6_K"
    assert plan["token_embd.weight"].ggml_type == "Q4_K"
    assert plan["output_norm.weight"].ggml_type == "F32"
    assert plan["blk.5.attn_norm.weight"].ggml_type == "F32"
    n = llama31.num_layers
    for i in range(n):
        more = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # use_more_bits
        want = "Q6_K" if more else "Q4_K"
        assert plan[f"blk.{i}.attn_v.weight"].ggml_type == want
        assert plan[f"blk.{i}.ffn_down.weight"].ggml_type == want
        assert plan[f"blk.{i}.attn_q.weight"].ggml_type == "Q4_K"
        assert plan[f"blk.{i}.ffn_up.weight"].ggml_type == "Q4_K"
    wb = weight_bytes(llama31, "gguf-Q4_K_M")
    assert wb.per_layer[0] > wb.per_layer[4]  # layer 0 uses more bits, layer 4 does not
    assert sum(g.nbytes for g in plan.values()) == wb.total_bytes


def test_gguf_tied_embeddings_take_the_output_type() -> None:
    spec = config_spec("meta-llama__Llama-3.2-1B")
    assert spec.tie_word_embeddings
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    assert "output.weight" not in plan
    assert plan["token_embd.weight"].ggml_type == "Q6_K"


def test_gguf_moe_experts() -> None:
    spec = config_spec("mistralai__Mixtral-8x7B-v0.1")
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    # 8 experts: attn_v and attn_k bumped to Q8_0; the router stays F32; experts split into gate/up/down
    assert plan["blk.3.attn_v.weight"].ggml_type == "Q8_0"
    assert plan["blk.3.attn_k.weight"].ggml_type == "Q8_0"
    assert plan["blk.3.ffn_gate_inp.weight"].ggml_type == "F32"
    assert plan["blk.3.ffn_gate_exps.weight"].shape == (8, 14336, 4096)
    assert plan["blk.0.ffn_down_exps.weight"].ggml_type == "Q6_K"
    assert plan["blk.4.ffn_down_exps.weight"].ggml_type == "Q4_K"
    wb = weight_bytes(spec, "gguf-Q4_K_M")
    assert wb.params == count_params(spec).total


def test_gguf_fallback_for_rows_not_divisible_by_256() -> None:
    # hidden 2880 = 90 x 32 is not a multiple of the K-quant super-block (256): llama.cpp falls back
    spec = ModelSpec(
        name="gpt-oss-like",
        model_type="llama",
        hidden_size=2880,
        num_layers=4,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
    )
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    assert plan["blk.1.attn_q.weight"].ggml_type == "Q5_0"  # tensor_type_fallback: Q4_K -> Q5_0
    assert plan["blk.0.attn_v.weight"].ggml_type == "Q5_0"  # 4 layers: use_more_bits only for the last
    assert plan["blk.3.attn_v.weight"].ggml_type == "Q8_0"  # Q6_K -> Q8_0
    assert plan["output.weight"].ggml_type == "Q8_0"  # output: ne0 % 256 != 0 -> Q8_0
    assert plan["blk.1.attn_output.weight"].ggml_type == "Q4_K"  # in-features 4096 divide
    assert weight_bytes(spec, "gguf-Q4_K_M").notes
    # a row of 100 fits no 32-block type: F16, noted, never a crash
    odd = spec.model_copy(
        update={"hidden_size": 100, "num_attention_heads": 4, "num_kv_heads": 4, "head_dim": 25}
    )
    for fid in ("gguf-Q4_K_M", "gguf-Q8_0", "gguf-IQ2_XS", "gguf-MXFP4"):
        wb = weight_bytes(odd, fid)
        assert wb.total_bytes > 0 and wb.notes


def test_gguf_deepseek_mla_split() -> None:
    spec = config_spec("deepseek-ai__DeepSeek-V3")
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    assert plan["blk.0.attn_k_b.weight"].ggml_type == "Q5_0"  # rows of 128 (qk_nope): Q4_K -> Q5_0
    assert plan["blk.0.attn_v_b.weight"].ggml_type == "Q4_K"
    assert "blk.0.attn_kv_b.weight" not in plan
    assert weight_bytes(spec, "gguf-Q4_K_M").params == count_params(spec).total


def test_gguf_plan_rejects_other_formats(llama31: ModelSpec) -> None:
    with pytest.raises(GpumemInputError):
        gguf_plan(llama31, "nf4")
