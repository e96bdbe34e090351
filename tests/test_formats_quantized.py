"""Quantized weight formats: bitsandbytes, GPTQ/AWQ, fp8 and microscaling (MX, NVFP4)."""

from __future__ import annotations

import math

import pytest

from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from tests.format_specs import LLAMA31, config_spec, linear_shapes


@pytest.fixture(scope="module")
def llama31() -> ModelSpec:
    return config_spec(LLAMA31)


# ---- bitsandbytes ---------------------------------------------------------------------------------------


def test_nf4_llama31(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "nf4")
    pc = count_params(llama31)
    linears = linear_shapes(llama31)
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
    assert wb.quantized_bytes == sum(o * i + 4 * o for o, i in linear_shapes(llama31))
    assert wb.by_storage["fp32 row scales (SCB)"] == sum(4 * o for o, _ in linear_shapes(llama31))


def test_compute_dtype_widens_only_the_kept_tensors(llama31: ModelSpec) -> None:
    a = weight_bytes(llama31, "nf4", compute_dtype_bytes=2)
    b = weight_bytes(llama31, "nf4", compute_dtype_bytes=4)
    assert b.quantized_bytes == a.quantized_bytes
    assert b.total_bytes - b.quantized_bytes == 2 * (a.total_bytes - a.quantized_bytes)


# ---- GPTQ / AWQ -----------------------------------------------------------------------------------------


def test_gptq4_llama31(llama31: ModelSpec) -> None:
    wb = weight_bytes(llama31, "gptq-4")
    linears = linear_shapes(llama31)
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
    spec = config_spec("deepseek-ai__DeepSeek-V3")
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
    linears = linear_shapes(llama31)
    assert wb.quantized_bytes == sum(o * i for o, i in linears) + 4 * len(linears)


def test_mx_and_nvfp4_bits(llama31: ModelSpec) -> None:
    assert weight_bytes(llama31, "mxfp4").quantized_bits_per_param == 4.25
    assert weight_bytes(llama31, "nvfp4").quantized_bits_per_param == pytest.approx(4.5, abs=1e-5)
    # gpt-oss style: only routed experts are MXFP4, so a dense model stays bf16
    assert weight_bytes(llama31, "mxfp4-moe").total_bytes == weight_bytes(llama31, "bf16").total_bytes


def test_experts_can_stay_unquantized() -> None:
    spec = config_spec("Qwen__Qwen3-30B-A3B")
    pc = count_params(spec)
    q = weight_bytes(spec, "nf4")
    kept = weight_bytes(spec, "nf4", quantize_experts=False)
    assert kept.by_component["routed_experts"] == 2 * pc.routed_experts
    assert q.by_component["routed_experts"] < pc.routed_experts  # ~4.5 bits
    assert weight_bytes(spec, "mxfp4-moe").by_component["attention"] == 2 * pc.by_component["attention"]


def test_vision_stays_at_compute_dtype() -> None:
    spec = config_spec("google__gemma-3-4b-it")
    assert spec.vision is not None
    v = spec.vision.params
    assert weight_bytes(spec, "bf16").by_component["vision"] == 2 * v
    assert weight_bytes(spec, "fp32").by_component["vision"] == 4 * v
    assert weight_bytes(spec, "nf4").by_component["vision"] == 2 * v
    assert weight_bytes(spec, "nf4", compute_dtype_bytes=4).by_component["vision"] == 4 * v
    assert weight_bytes(spec, "gguf-Q4_K_M").by_component["vision"] == 2 * v
    assert "vision" in weight_bytes(spec, "gptq-4").explain.formula
