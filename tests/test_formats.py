"""Weight formats (bytes per format, llama.cpp mixes) and KV-cache dtypes."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import (
    KV_DTYPES,
    check_kv_dtype,
    engine_kv_dtypes,
    get_weight_format,
    gguf_plan,
    kv_bytes_per_element,
    list_weight_formats,
    weight_bytes,
)
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.spec.model import MLASpec, ModelSpec, MoESpec, VisionSpec
from gpumem_gui.core.spec.params import COMPONENTS, count_params, text_tensors

CONFIGS = Path(__file__).parent / "reference" / "configs"
EXTRA = Path(__file__).parent / "reference" / "extra" / "configs"
ALL_CONFIGS = sorted(CONFIGS.glob("*.json")) + sorted(EXTRA.glob("*.json"))
FORMAT_IDS = [f.id for f in list_weight_formats()]


def _spec(name: str) -> ModelSpec:
    return load_config_file(CONFIGS / f"{name}.json")


@pytest.fixture(scope="module")
def llama31() -> ModelSpec:
    return _spec("meta-llama__Llama-3.1-8B")


def _linears(spec: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of every decoder-layer linear weight (attention and MLP) of a dense spec."""
    return [
        t.shape
        for t in text_tensors(spec)
        if t.component in ("attention", "mlp") and t.name.endswith(".weight") and len(t.shape) == 2
    ]


# ---- registry -------------------------------------------------------------------------------------------


def test_registry_has_the_required_ids() -> None:
    required = {
        "fp32", "fp16", "bf16", "fp8", "fp8-block", "int8", "nf4", "fp4", "nf4-dq", "fp4-dq", "gptq-2",
        "gptq-3", "gptq-4", "gptq-8", "awq-4", "mxfp4", "nvfp4", "gguf-Q4_K", "gguf-Q8_0", "gguf-IQ4_XS",
        "gguf-Q4_K_M", "gguf-Q4_K_S", "gguf-Q5_K_M", "gguf-Q5_K_S", "gguf-Q6_K", "gguf-Q3_K_M", "gguf-Q3_K_S",
        "gguf-Q3_K_L", "gguf-Q2_K", "gguf-Q4_0", "gguf-F16", "gguf-BF16",
    }  # fmt: skip
    assert required <= set(FORMAT_IDS)
    assert len(FORMAT_IDS) == len(set(FORMAT_IDS))
    for f in list_weight_formats():
        assert f.source and f.label and f.description and f.bits > 0


def test_every_weight_carrying_ggml_type_is_a_format() -> None:
    from gguf import GGML_QUANT_SIZES

    skipped = {"F32", "F16", "BF16", "Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"}
    for t, (block, size) in GGML_QUANT_SIZES.items():
        if t.name in skipped:
            continue
        ids = (f"gguf-{t.name}", f"gguf-{t.name}-pure")
        fmt = next(f for f in list_weight_formats() if f.id in ids and f.family == "gguf")
        assert fmt.bits == size * 8 / block


def test_format_bits_follow_block_layouts() -> None:
    assert get_weight_format("nf4").bits == 4.5  # 4 + 32/64
    assert get_weight_format("nf4-dq").bits == pytest.approx(4.127, abs=5e-4)  # 4 + 8/64 + 32/(64*256)
    assert get_weight_format("gptq-4").bits == 4 + 16 / 128 + 4 / 128
    assert get_weight_format("mxfp4").bits == 4.25
    assert get_weight_format("nvfp4").bits == 4.5
    assert get_weight_format("gguf-Q4_K").bits == 4.5  # 144 B per 256
    assert get_weight_format("gguf-Q6_K").bits == 6.5625  # 210 B per 256
    assert get_weight_format("gguf-Q8_0").bits == 8.5  # 34 B per 32


def test_unknown_format_is_a_clear_error(llama31: ModelSpec) -> None:
    with pytest.raises(GpumemInputError) as e:
        get_weight_format("nf5")
    assert e.value.field == "weights"
    assert "nf4" in str(e.value) and "nf5" in str(e.value)
    with pytest.raises(GpumemInputError) as e:
        weight_bytes(llama31, "gguf-Q4_K_X")
    assert e.value.field == "weights" and "gguf-Q4_K_M" in str(e.value)
    with pytest.raises(GpumemInputError):
        weight_bytes(llama31, "bf16", compute_dtype_bytes=3)


def test_format_ids_are_case_insensitive(llama31: ModelSpec) -> None:
    assert get_weight_format("GGUF-q4_k_m").id == "gguf-Q4_K_M"
    assert weight_bytes(llama31, "BF16").format == "bf16"


# ---- float formats --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.stem)
def test_float_formats_are_exact(path: Path) -> None:
    spec = load_config_file(path)
    pc = count_params(spec)
    for fid, width in (("bf16", 2), ("fp16", 2), ("fp32", 4)):
        wb = weight_bytes(spec, fid)
        assert wb.total_bytes == width * pc.total
        assert wb.by_component == {k: width * v for k, v in pc.by_component.items()}
        assert wb.per_layer == tuple(width * n for n in pc.per_layer)
        assert wb.bits_per_param == 8 * width
        assert wb.quantized_params == 0


# ---- bitsandbytes ---------------------------------------------------------------------------------------


def test_nf4_llama31(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "nf4")
    pc = count_params(llama31)
    linears = _linears(llama31)
    q_params = sum(o * i for o, i in linears)
    assert wb.quantized_params == q_params == pc.by_component["attention"] + pc.by_component["mlp"]
    # packed 4-bit + fp32 absmax per 64 + the 16-entry fp32 quant_map of each module
    expected = sum(o * i // 2 + 4 * math.ceil(o * i / 64) + 64 for o, i in linears)
    assert wb.quantized_bytes == expected
    assert wb.quantized_bits_per_param == pytest.approx(4.5, abs=1e-3)
    # embeddings, lm_head and norms stay 16-bit
    kept = pc.total - q_params
    assert wb.total_bytes - wb.quantized_bytes == 2 * kept
    assert wb.by_component["embedding"] == 2 * pc.embedding
    assert wb.by_component["lm_head"] == 2 * pc.lm_head
    assert wb.by_component["norms"] == 2 * pc.by_component["norms"]
    assert sum(wb.by_storage.values()) == wb.total_bytes


def test_nf4_double_quant_llama31(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "nf4-dq")
    # QLoRA: 4 + 8/64 + 32/(64*256) = 4.127 bits
    assert wb.quantized_bits_per_param == pytest.approx(4.127, abs=1e-3)
    assert wb.quantized_bytes < weight_bytes(llama31, "nf4").quantized_bytes
    assert weight_bytes(llama31, "fp4-dq").total_bytes == wb.total_bytes  # same layout, other code book


def test_int8_has_a_row_scale_per_output(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "int8")
    assert wb.quantized_bytes == sum(o * i + 4 * o for o, i in _linears(llama31))
    assert wb.by_storage["fp32 row scales (SCB)"] == sum(4 * o for o, _ in _linears(llama31))


def test_compute_dtype_widens_only_the_kept_tensors(llama31: ModelSpec) -> None:
    a = weight_bytes(llama31, "nf4", compute_dtype_bytes=2)
    b = weight_bytes(llama31, "nf4", compute_dtype_bytes=4)
    assert b.quantized_bytes == a.quantized_bytes
    assert b.total_bytes - b.quantized_bytes == 2 * (a.total_bytes - a.quantized_bytes)


# ---- GPTQ / AWQ -----------------------------------------------------------------------------------------


def test_gptq4_llama31(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "gptq-4")
    linears = _linears(llama31)
    # qweight 4/8 B + fp16 scales per 128 + 4-bit zeros per 128 per weight, + int32 g_idx per in-feature
    expected = sum(o * i // 2 + (i // 128) * o * 2 + (i // 128) * o // 2 + 4 * i for o, i in linears)
    assert wb.quantized_bytes == expected
    g_idx_bits = sum(32 * i for _, i in linears) / sum(o * i for o, i in linears)
    assert wb.quantized_bits_per_param == pytest.approx(4 + 16 / 128 + 4 / 128 + g_idx_bits, rel=1e-12)
    awq = weight_bytes(llama31, "awq-4")
    assert awq.quantized_bits_per_param == pytest.approx(4 + 16 / 128 + 4 / 128, rel=1e-12)  # no g_idx


def test_gptq_orders_by_bits(llama31: ModelSpec) -> None:
    sizes = [weight_bytes(llama31, f"gptq-{b}").total_bytes for b in (2, 3, 4, 8)]
    assert sizes == sorted(sizes)


def test_gptq_keeps_misaligned_modules_16bit() -> None:
    # intermediate 5000: down_proj has in-features 5000 (not a multiple of 32 or 128) -> stays 16-bit,
    # gate/up have out-features 5000 (not a multiple of 32) -> stay 16-bit too; no crash
    spec = ModelSpec(
        name="odd",
        model_type="llama",
        hidden_size=512,
        num_layers=2,
        num_attention_heads=8,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=5000,
        vocab_size=1000,
    )
    pc = count_params(spec)
    for fid in ("gptq-4", "gptq-3", "awq-4"):
        wb = weight_bytes(spec, fid)
        assert wb.by_component["mlp"] == 2 * pc.by_component["mlp"]
        assert wb.quantized_params == pc.by_component["attention"]
    # NVFP4 needs in % 16: down_proj (in 5000 = 16 * 312.5) stays 16-bit, gate/up (in 512) are quantized
    nv = weight_bytes(spec, "nvfp4")
    assert nv.quantized_params == pc.by_component["attention"] + 2 * 2 * 512 * 5000


# ---- fp8 / microscaling ---------------------------------------------------------------------------------


def test_fp8_block_scales_deepseek_v3() -> None:
    spec = _spec("deepseek-ai__DeepSeek-V3")
    assert spec.moe is not None
    wb = weight_bytes(spec, "fp8-block")
    pc = count_params(spec)
    e, f, h = spec.moe.num_experts, spec.moe.expert_intermediate_size, spec.hidden_size
    blocks = math.ceil(f / 128) * math.ceil(h / 128)
    # per expert: gate, up and down, each with its own 128x128 fp32 scale_inv grid
    assert wb.by_component["routed_experts"] == pc.routed_experts + 4 * e * 3 * blocks * spec.num_moe_layers
    assert wb.by_component["router"] == 2 * pc.by_component["router"]
    assert wb.by_component["embedding"] == 2 * pc.embedding


def test_fp8_per_tensor_scales(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "fp8")
    linears = _linears(llama31)
    assert wb.quantized_bytes == sum(o * i for o, i in linears) + 4 * len(linears)


def test_mx_and_nvfp4_bits(llama31: ModelSpec) -> None:
    assert weight_bytes(llama31, "mxfp4").quantized_bits_per_param == 4.25
    assert weight_bytes(llama31, "nvfp4").quantized_bits_per_param == pytest.approx(4.5, abs=1e-5)
    # gpt-oss style: only routed experts are MXFP4, so a dense model stays bf16
    assert weight_bytes(llama31, "mxfp4-moe").total_bytes == weight_bytes(llama31, "bf16").total_bytes


def test_experts_can_stay_unquantized() -> None:
    spec = _spec("Qwen__Qwen3-30B-A3B")
    pc = count_params(spec)
    q = weight_bytes(spec, "nf4")
    kept = weight_bytes(spec, "nf4", quantize_experts=False)
    assert kept.by_component["routed_experts"] == 2 * pc.routed_experts
    assert q.by_component["routed_experts"] < pc.routed_experts  # ~4.5 bits
    assert weight_bytes(spec, "mxfp4-moe").by_component["attention"] == 2 * pc.by_component["attention"]


def test_vision_stays_at_compute_dtype() -> None:
    spec = _spec("google__gemma-3-4b-it")
    assert spec.vision is not None
    v = spec.vision.params
    assert weight_bytes(spec, "bf16").by_component["vision"] == 2 * v
    assert weight_bytes(spec, "fp32").by_component["vision"] == 4 * v
    assert weight_bytes(spec, "nf4").by_component["vision"] == 2 * v
    assert weight_bytes(spec, "nf4", compute_dtype_bytes=4).by_component["vision"] == 4 * v
    assert weight_bytes(spec, "gguf-Q4_K_M").by_component["vision"] == 2 * v
    assert "vision" in weight_bytes(spec, "gptq-4").explain.formula


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
    wb = weight_bytes(_spec("meta-llama__Meta-Llama-3-8B"), "gguf-Q4_K_M")
    assert wb.bits_per_param == pytest.approx(4.89, rel=0.02)
    assert wb.total_bytes / 2**30 == pytest.approx(4.58, rel=0.02)


def test_gguf_q4_k_m_llama2_7b_published_log() -> None:
    # llamafile server log (shared/reference/published: inf-llamacpp-llama2-7b-q4_k_m):
    # "model size = 3.80 GiB (4.84 BPW)"
    wb = weight_bytes(_spec("meta-llama__Llama-2-7b-hf"), "gguf-Q4_K_M")
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
    spec = _spec("meta-llama__Llama-3.2-1B")
    assert spec.tie_word_embeddings
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    assert "output.weight" not in plan
    assert plan["token_embd.weight"].ggml_type == "Q6_K"


def test_gguf_moe_experts() -> None:
    spec = _spec("mistralai__Mixtral-8x7B-v0.1")
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
    spec = _spec("deepseek-ai__DeepSeek-V3")
    plan = {g.name: g for g in gguf_plan(spec, "gguf-Q4_K_M")}
    assert plan["blk.0.attn_k_b.weight"].ggml_type == "Q5_0"  # rows of 128 (qk_nope): Q4_K -> Q5_0
    assert plan["blk.0.attn_v_b.weight"].ggml_type == "Q4_K"
    assert "blk.0.attn_kv_b.weight" not in plan
    assert weight_bytes(spec, "gguf-Q4_K_M").params == count_params(spec).total


def test_gguf_plan_rejects_other_formats(llama31: ModelSpec) -> None:
    with pytest.raises(GpumemInputError):
        gguf_plan(llama31, "nf4")


# ---- speed ----------------------------------------------------------------------------------------------


def test_weight_bytes_is_fast(llama31: ModelSpec) -> None:
    weight_bytes(llama31, "gguf-Q4_K_M")
    start = time.perf_counter()
    for _ in range(1000):
        weight_bytes(llama31, "gguf-Q4_K_M")
    assert time.perf_counter() - start < 1.0  # cached: microseconds per call


# ---- KV-cache dtypes ------------------------------------------------------------------------------------


def test_kv_bytes_per_element() -> None:
    assert kv_bytes_per_element("fp32") == 4
    assert kv_bytes_per_element("fp16") == kv_bytes_per_element("bf16") == 2
    for k in ("fp8", "fp8_e4m3", "fp8_e5m2", "int8"):
        assert kv_bytes_per_element(k) == 1
    assert kv_bytes_per_element("q8_0") == 34 / 32
    assert kv_bytes_per_element("q4_0") == 18 / 32
    assert kv_bytes_per_element("q4_1") == 20 / 32
    assert kv_bytes_per_element("q5_0") == 22 / 32
    assert kv_bytes_per_element("q5_1") == 24 / 32
    assert kv_bytes_per_element("iq4_nl") == 18 / 32
    assert kv_bytes_per_element("f16") == 2  # llama.cpp spelling
    assert KV_DTYPES["q8_0"] == 34 / 32
    with pytest.raises(GpumemInputError) as e:
        kv_bytes_per_element("q3_k")
    assert e.value.field == "kv_dtype"


def test_engine_kv_dtypes() -> None:
    assert set(engine_kv_dtypes("llama.cpp")) == {
        "fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
    }  # fmt: skip
    assert {"fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"} <= set(engine_kv_dtypes("vllm"))
    assert {"fp16", "bf16", "fp32"} <= set(engine_kv_dtypes("transformers"))
    assert all(k in KV_DTYPES for e in ("transformers", "vllm", "llama.cpp") for k in engine_kv_dtypes(e))


def test_check_kv_dtype() -> None:
    check_kv_dtype("vllm", "fp8")
    check_kv_dtype("vllm", "auto")
    check_kv_dtype("llama.cpp", "q8_0")
    check_kv_dtype("llama.cpp", "f16")
    check_kv_dtype("transformers", "bf16")
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("vllm", "q8_0")
    assert e.value.field == "kv_dtype"
    msg = str(e.value)
    assert "vllm" in msg and "fp8_e5m2" in msg and "q8_0" in msg
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("llama.cpp", "fp8")
    assert "q4_0" in str(e.value)
    with pytest.raises(GpumemInputError) as e:
        check_kv_dtype("tensorrt", "fp8")
    assert e.value.field == "engine"


# ---- properties -----------------------------------------------------------------------------------------


@st.composite
def specs(draw: st.DrawFn, aligned: bool = False) -> ModelSpec:
    """Random valid specs; ``aligned``: every matrix dimension a multiple of 256 (no fallbacks anywhere)."""
    unit = 256 if aligned else 1
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([256] if aligned else [16, 32, 64, 80, 128]))
    hidden = unit * draw(st.integers(1, 8)) if aligned else draw(st.integers(8, 2048))
    inter = unit * draw(st.integers(1, 12)) if aligned else draw(st.integers(8, 6000))
    layers = draw(st.integers(1, 6))
    moe = None
    if draw(st.booleans()):
        n_exp = draw(st.integers(1, 8))
        moe = MoESpec(
            num_experts=n_exp,
            experts_per_token=draw(st.integers(1, n_exp)),
            expert_intermediate_size=unit * draw(st.integers(1, 4))
            if aligned
            else draw(st.integers(8, 1024)),
            shared_expert_intermediate_size=unit * draw(st.integers(0, 2))
            if aligned
            else draw(st.integers(0, 512)),
            shared_expert_gate=draw(st.booleans()),
            router_bias=draw(st.booleans()),
            expert_bias=draw(st.booleans()),
            dense_layers=tuple(sorted(draw(st.sets(st.integers(0, layers - 1))))),
        )
    mla = None
    if not aligned and draw(st.booleans()):
        mla = MLASpec(
            q_lora_rank=draw(st.none() | st.integers(8, 256)),
            kv_lora_rank=draw(st.integers(8, 256)),
            qk_nope_head_dim=draw(st.integers(8, 64)),
            qk_rope_head_dim=draw(st.integers(8, 64)),
            v_head_dim=draw(st.integers(8, 64)),
        )
    vision = None
    if draw(st.booleans()):
        vision = VisionSpec(kind="siglip", tower_params=draw(st.integers(0, 10**6)), projector_params=1000)
    return ModelSpec(
        name="random",
        model_type=draw(st.sampled_from(["llama", "qwen3", "falcon", "phi3", "mixtral", "deepseek_v3"])),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=unit * draw(st.integers(1, 64)) if aligned else draw(st.integers(8, 100_000)),
        tie_word_embeddings=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
        o_bias=draw(st.booleans()),
        mlp_bias=draw(st.booleans()),
        mlp_gated=draw(st.booleans()),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        norm_bias=draw(st.booleans()),
        qk_norm=draw(st.sampled_from(["none", "per_head", "full_width"])),
        moe=moe,
        mla=mla,
        vision=vision,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_every_format_adds_up(spec: ModelSpec) -> None:
    pc = count_params(spec)
    for fid in FORMAT_IDS:
        wb = weight_bytes(spec, fid)
        assert set(wb.by_component) == set(COMPONENTS)
        assert all(v >= 0 for v in wb.by_component.values())
        assert all(v >= 0 for v in wb.by_storage.values())
        assert sum(wb.by_component.values()) == wb.total_bytes
        assert sum(wb.by_storage.values()) == wb.total_bytes
        assert len(wb.per_layer) == spec.num_layers
        assert sum(wb.per_layer) <= wb.total_bytes
        assert wb.params == pc.total
        assert wb.quantized_params <= wb.params and wb.quantized_bytes <= wb.total_bytes
        assert weight_bytes(spec, fid, compute_dtype_bytes=4).total_bytes >= wb.total_bytes
    # every layer's bytes scale with its parameters in the plain formats
    assert weight_bytes(spec, "bf16").per_layer == tuple(2 * n for n in pc.per_layer)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(aligned=True))
def test_total_is_monotone_in_bits(spec: ModelSpec) -> None:
    def total(fid: str) -> int:
        return weight_bytes(spec, fid).total_bytes

    for chain in (
        ["fp32", "bf16", "fp8", "nf4"],
        ["fp32", "bf16", "int8", "nf4"],
        ["gptq-8", "gptq-4", "gptq-3", "gptq-2"],
        ["bf16", "fp8-block", "mxfp4"],
        ["bf16", "nvfp4", "gptq-4"],
    ):
        sizes = [total(f) for f in chain]
        assert sizes == sorted(sizes, reverse=True), dict(zip(chain, sizes, strict=True))
    single = sorted((f for f in list_weight_formats() if f.family == "gguf"), key=lambda f: -f.bits)
    sizes = [total(f.id) for f in single]
    assert sizes == sorted(sizes, reverse=True)
    # llama.cpp mixes are not ordered by name in general (Q4_K_S bumps attn_v in the first 4 layers, which
    # can outweigh Q4_K_M's use_more_bits in a shallow model); these chains hold for every architecture
    mixes = ["gguf-F32", "gguf-F16", "gguf-Q8_0", "gguf-Q6_K", "gguf-Q5_K_M", "gguf-Q5_K_S"]
    sizes = [total(f) for f in mixes]
    assert sizes == sorted(sizes, reverse=True), dict(zip(mixes, sizes, strict=True))
    assert total("gguf-Q3_K_M") >= total("gguf-Q3_K_S")
