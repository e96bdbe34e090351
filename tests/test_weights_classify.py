"""classify_tensor: real tensor names from Hugging Face checkpoints and GGUF files -> (component, layer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.readers.weights import (
    INVENTORY_COMPONENTS,
    WeightTensor,
    build_inventory,
    classify_tensor,
    make_tensor,
)
from gpumem_gui.core.spec.params import COMPONENTS, text_tensors

# (name, component, layer): names as they appear in the checkpoints of the named families.
HF_NAMES = [
    # Llama / Qwen2 / Mistral
    ("model.embed_tokens.weight", "embedding", None),
    ("model.layers.0.self_attn.q_proj.weight", "attention", 0),
    ("model.layers.12.self_attn.k_proj.bias", "attention", 12),
    ("model.layers.3.self_attn.v_proj.weight", "attention", 3),
    ("model.layers.3.self_attn.o_proj.weight", "attention", 3),
    ("model.layers.7.mlp.gate_proj.weight", "mlp", 7),
    ("model.layers.7.mlp.up_proj.weight", "mlp", 7),
    ("model.layers.7.mlp.down_proj.weight", "mlp", 7),
    ("model.layers.0.input_layernorm.weight", "norms", 0),
    ("model.layers.0.post_attention_layernorm.weight", "norms", 0),
    ("model.layers.0.self_attn.rotary_emb.inv_freq", "attention", 0),
    ("model.norm.weight", "norms", None),
    ("lm_head.weight", "lm_head", None),
    # Qwen3 / Gemma per-head q/k norms, Gemma-2 sandwich norms
    ("model.layers.5.self_attn.q_norm.weight", "norms", 5),
    ("model.layers.5.self_attn.k_norm.weight", "norms", 5),
    ("model.layers.1.pre_feedforward_layernorm.weight", "norms", 1),
    ("model.layers.1.post_feedforward_layernorm.weight", "norms", 1),
    # Mixtral
    ("model.layers.2.block_sparse_moe.gate.weight", "router", 2),
    ("model.layers.2.block_sparse_moe.experts.7.w1.weight", "routed_experts", 2),
    ("model.layers.2.block_sparse_moe.experts.7.w2.weight", "routed_experts", 2),
    ("model.layers.2.block_sparse_moe.experts.0.w3.weight", "routed_experts", 2),
    # Qwen2-MoE / Qwen3-MoE
    ("model.layers.4.mlp.gate.weight", "router", 4),
    ("model.layers.4.mlp.experts.59.gate_proj.weight", "routed_experts", 4),
    ("model.layers.4.mlp.experts.59.up_proj.weight", "routed_experts", 4),
    ("model.layers.4.mlp.experts.59.down_proj.weight", "routed_experts", 4),
    ("model.layers.4.mlp.shared_expert.gate_proj.weight", "shared_experts", 4),
    ("model.layers.4.mlp.shared_expert.down_proj.weight", "shared_experts", 4),
    ("model.layers.4.mlp.shared_expert_gate.weight", "shared_experts", 4),
    # transformers 5 fused experts
    ("model.layers.9.mlp.experts.gate_up_proj", "routed_experts", 9),
    ("model.layers.9.mlp.experts.down_proj", "routed_experts", 9),
    # DeepSeek-V2/V3 (MLA, shared experts, router correction bias)
    ("model.layers.0.self_attn.q_a_proj.weight", "attention", 0),
    ("model.layers.0.self_attn.q_a_layernorm.weight", "norms", 0),
    ("model.layers.0.self_attn.q_b_proj.weight", "attention", 0),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "attention", 0),
    ("model.layers.0.self_attn.kv_a_layernorm.weight", "norms", 0),
    ("model.layers.0.self_attn.kv_b_proj.weight", "attention", 0),
    ("model.layers.3.mlp.shared_experts.up_proj.weight", "shared_experts", 3),
    ("model.layers.3.mlp.gate.e_score_correction_bias", "router", 3),
    ("model.layers.3.mlp.experts.255.down_proj.weight", "routed_experts", 3),
    # gpt-oss
    ("model.layers.1.mlp.router.weight", "router", 1),
    ("model.layers.1.mlp.experts.gate_up_proj_blocks", "routed_experts", 1),
    ("model.layers.1.mlp.experts.gate_up_proj_scales", "routed_experts", 1),
    ("model.layers.1.self_attn.sinks", "attention", 1),
    # GPT-2 (with and without the transformer. prefix)
    ("transformer.wte.weight", "embedding", None),
    ("transformer.wpe.weight", "position_embedding", None),
    ("transformer.h.0.ln_1.weight", "norms", 0),
    ("transformer.h.0.ln_2.bias", "norms", 0),
    ("transformer.h.0.attn.c_attn.weight", "attention", 0),
    ("transformer.h.0.attn.c_proj.bias", "attention", 0),
    ("transformer.h.0.attn.bias", "attention", 0),
    ("transformer.h.11.mlp.c_fc.weight", "mlp", 11),
    ("transformer.h.11.mlp.c_proj.weight", "mlp", 11),
    ("transformer.ln_f.weight", "norms", None),
    ("h.3.attn.c_attn.weight", "attention", 3),
    ("wte.weight", "embedding", None),
    # OPT
    ("model.decoder.embed_tokens.weight", "embedding", None),
    ("model.decoder.embed_positions.weight", "position_embedding", None),
    ("model.decoder.project_in.weight", "embedding_extra", None),
    ("model.decoder.project_out.weight", "embedding_extra", None),
    ("model.decoder.layers.2.self_attn.out_proj.weight", "attention", 2),
    ("model.decoder.layers.2.self_attn_layer_norm.weight", "norms", 2),
    ("model.decoder.layers.2.fc1.weight", "mlp", 2),
    ("model.decoder.layers.2.fc2.bias", "mlp", 2),
    ("model.decoder.final_layer_norm.weight", "norms", None),
    # BLOOM
    ("transformer.word_embeddings.weight", "embedding", None),
    ("transformer.word_embeddings_layernorm.weight", "norms", None),
    ("transformer.h.1.self_attention.query_key_value.weight", "attention", 1),
    ("transformer.h.1.self_attention.dense.weight", "attention", 1),
    ("transformer.h.1.mlp.dense_h_to_4h.weight", "mlp", 1),
    ("transformer.h.1.mlp.dense_4h_to_h.bias", "mlp", 1),
    # Falcon
    ("transformer.h.31.self_attention.query_key_value.weight", "attention", 31),
    ("transformer.h.31.ln_attn.weight", "norms", 31),
    ("transformer.h.31.ln_mlp.bias", "norms", 31),
    # GPT-NeoX / Pythia
    ("gpt_neox.embed_in.weight", "embedding", None),
    ("gpt_neox.layers.5.attention.query_key_value.weight", "attention", 5),
    ("gpt_neox.layers.5.attention.dense.weight", "attention", 5),
    ("gpt_neox.layers.5.mlp.dense_h_to_4h.weight", "mlp", 5),
    ("gpt_neox.final_layer_norm.weight", "norms", None),
    ("embed_out.weight", "lm_head", None),
    # Phi-3 fused projections
    ("model.layers.0.self_attn.qkv_proj.weight", "attention", 0),
    ("model.layers.0.mlp.gate_up_proj.weight", "mlp", 0),
    # Mistral native (consolidated.safetensors) / InternLM2
    ("tok_embeddings.weight", "embedding", None),
    ("layers.0.attention.wq.weight", "attention", 0),
    ("layers.0.attention.wo.weight", "attention", 0),
    ("layers.0.feed_forward.w1.weight", "mlp", 0),
    ("layers.0.attention_norm.weight", "norms", 0),
    ("layers.0.ffn_norm.weight", "norms", 0),
    ("norm.weight", "norms", None),
    ("output.weight", "lm_head", None),
    # multimodal (LLaVA, Gemma 3, Qwen2-VL, transformers 5 layout)
    ("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", "vision", None),
    ("model.vision_tower.vision_model.embeddings.position_embedding.weight", "vision", None),
    ("multi_modal_projector.linear_1.weight", "vision", None),
    ("model.multi_modal_projector.mm_input_projection_weight", "vision", None),
    ("visual.blocks.0.attn.qkv.weight", "vision", None),
    ("model.visual.merger.mlp.0.weight", "vision", None),
    ("language_model.model.layers.3.mlp.down_proj.weight", "mlp", 3),
    ("model.language_model.embed_tokens.weight", "embedding", None),
    # quantization side tensors follow their weight's module
    ("model.layers.0.self_attn.q_proj.qweight", "attention", 0),
    ("model.layers.0.self_attn.q_proj.qzeros", "attention", 0),
    ("model.layers.0.self_attn.q_proj.scales", "attention", 0),
    ("model.layers.0.self_attn.q_proj.g_idx", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight_scale_inv", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight_scale", "attention", 0),
    ("model.layers.0.self_attn.q_proj.input_scale", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight.absmax", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight.quant_map", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight.nested_absmax", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight.nested_quant_map", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4", "attention", 0),
    ("model.layers.0.self_attn.q_proj.SCB", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight_format", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight_packed", "attention", 0),
    ("model.layers.0.self_attn.q_proj.weight_zero_point", "attention", 0),
    ("model.layers.0.mlp.down_proj.weight_scale_inv", "mlp", 0),
    ("model.layers.6.mlp.experts.3.up_proj.qweight", "routed_experts", 6),
    ("model.layers.6.mlp.shared_experts.down_proj.weight_scale_inv", "shared_experts", 6),
    ("something.unrelated", "other", None),
]

GGUF_NAMES = [
    ("token_embd.weight", "embedding", None),
    ("token_embd_norm.weight", "norms", None),
    ("position_embd.weight", "position_embedding", None),
    ("output.weight", "lm_head", None),
    ("output.bias", "lm_head", None),
    ("output_norm.weight", "norms", None),
    ("rope_freqs.weight", "other", None),
    ("blk.0.attn_q.weight", "attention", 0),
    ("blk.0.attn_k.weight", "attention", 0),
    ("blk.0.attn_v.weight", "attention", 0),
    ("blk.0.attn_output.weight", "attention", 0),
    ("blk.17.attn_qkv.weight", "attention", 17),
    ("blk.17.attn_qkv.bias", "attention", 17),
    ("blk.2.attn_q_a.weight", "attention", 2),
    ("blk.2.attn_q_b.weight", "attention", 2),
    ("blk.2.attn_kv_a_mqa.weight", "attention", 2),
    ("blk.2.attn_kv_b.weight", "attention", 2),
    ("blk.2.attn_k_b.weight", "attention", 2),
    ("blk.2.attn_v_b.weight", "attention", 2),
    ("blk.2.attn_q_a_norm.weight", "norms", 2),
    ("blk.2.attn_kv_a_norm.weight", "norms", 2),
    ("blk.0.attn_norm.weight", "norms", 0),
    ("blk.0.attn_norm_2.weight", "norms", 0),
    ("blk.0.attn_q_norm.weight", "norms", 0),
    ("blk.0.attn_k_norm.weight", "norms", 0),
    ("blk.0.post_attention_norm.weight", "norms", 0),
    ("blk.0.ffn_norm.weight", "norms", 0),
    ("blk.0.post_ffw_norm.weight", "norms", 0),
    ("blk.5.ffn_gate.weight", "mlp", 5),
    ("blk.5.ffn_up.weight", "mlp", 5),
    ("blk.5.ffn_down.weight", "mlp", 5),
    ("blk.5.ffn_up.bias", "mlp", 5),
    ("blk.8.ffn_gate_exps.weight", "routed_experts", 8),
    ("blk.8.ffn_up_exps.weight", "routed_experts", 8),
    ("blk.8.ffn_down_exps.weight", "routed_experts", 8),
    ("blk.8.ffn_gate_up_exps.weight", "routed_experts", 8),
    ("blk.8.ffn_gate_inp.weight", "router", 8),
    ("blk.8.exp_probs_b.bias", "router", 8),
    ("blk.8.ffn_gate_shexp.weight", "shared_experts", 8),
    ("blk.8.ffn_up_shexp.weight", "shared_experts", 8),
    ("blk.8.ffn_down_shexp.weight", "shared_experts", 8),
    ("blk.8.ffn_gate_inp_shexp.weight", "shared_experts", 8),
    ("blk.1.ffn_gate.3.weight", "routed_experts", 1),  # per-expert tensors of early Mixtral GGUFs
    ("blk.1.attn_sinks.weight", "attention", 1),
    # mmproj files
    ("v.blk.0.attn_q.weight", "vision", None),
    ("v.patch_embd.weight", "vision", None),
    ("v.position_embd.weight", "vision", None),
    ("mm.0.weight", "vision", None),
    ("mm.input_projection.weight", "vision", None),
    ("a.blk.0.attn_q.weight", "other", None),
    ("mm.a.mlp.0.weight", "other", None),
]


@pytest.mark.parametrize(("name", "component", "layer"), HF_NAMES + GGUF_NAMES)
def test_classify(name: str, component: str, layer: int | None) -> None:
    assert classify_tensor(name) == (component, layer)


def test_components_are_params_components_plus_other() -> None:
    assert (*COMPONENTS, "other") == INVENTORY_COMPONENTS
    for _, component, _ in HF_NAMES + GGUF_NAMES:
        assert component in INVENTORY_COMPONENTS


def test_weight_tensor_checks_itself() -> None:
    t = make_tensor("model.layers.1.mlp.up_proj.weight", "BF16", (8, 4), 64)
    assert (t.component, t.layer, t.elements) == ("mlp", 1, 32)
    with pytest.raises(ValidationError):
        WeightTensor(name="x", dtype="F32", shape=(2, 3), elements=5, nbytes=20, component="mlp")
    with pytest.raises(ValidationError):
        WeightTensor(name="x", dtype="F32", shape=(2,), elements=2, nbytes=8, component="nope")
    with pytest.raises(ValidationError):
        t.nbytes = 1  # type: ignore[misc]


def test_build_inventory_totals() -> None:
    ts = [
        make_tensor("model.embed_tokens.weight", "BF16", (10, 4), 80),
        make_tensor("model.layers.0.self_attn.q_proj.weight", "BF16", (4, 4), 32),
        make_tensor("model.layers.0.input_layernorm.weight", "F32", (4,), 16),
    ]
    inv = build_inventory(format="safetensors", source="s", files=["f"], tensors=ts, quantization=None)
    assert inv.tensor_count == 3
    assert inv.total_bytes == 128
    assert inv.total_elements == 60
    assert inv.bytes_by_dtype == {"BF16": 112, "F32": 16}
    assert inv.elements_by_dtype == {"BF16": 56, "F32": 4}
    assert inv.bytes_by_component["embedding"] == 80
    assert inv.bytes_by_component["attention"] == 32
    assert inv.bytes_by_component["norms"] == 16
    assert set(inv.bytes_by_component) == set(INVENTORY_COMPONENTS)
    assert sum(inv.bytes_by_component.values()) == inv.total_bytes
    assert inv.tensor("model.embed_tokens.weight") == ts[0]
    assert inv.tensor("missing") is None
    with pytest.raises(ValidationError):
        inv.model_validate({**inv.model_dump(), "total_bytes": 1})


def _reference_configs() -> list[Path]:
    ref = Path(__file__).resolve().parent / "reference"
    return sorted([*ref.glob("configs/*.json"), *ref.glob("extra/configs/*.json")])


@pytest.mark.parametrize("config", _reference_configs(), ids=lambda p: p.stem)
def test_agrees_with_parameter_accounting(config: Path) -> None:
    """Every tensor params.py names for a real architecture is classified into the same component."""
    spec = load_config_file(config)
    for t in text_tensors(spec):
        component, layer = classify_tensor(f"model.{t.name}")
        assert (component, layer) == (t.component, t.layer), t.name
