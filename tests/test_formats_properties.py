"""Properties of every weight format on random specs: totals add up, sizes order by bits."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.formats import list_weight_formats, weight_bytes
from gpumem_gui.core.spec.model import MLASpec, ModelSpec, MoESpec, VisionSpec
from gpumem_gui.core.spec.params import COMPONENTS, count_params
from tests.format_specs import FORMAT_IDS

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
            qk_rope_head_dim=2 * draw(st.integers(4, 32)),  # even: the rotary halves
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
