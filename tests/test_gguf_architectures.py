"""GGUF files of other architectures (MoE, MLA, learned positions, sliding windows, fused projections): the
spec's parameter count must equal the file's element count."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf

from gpumem_gui.core.readers.gguf import load_gguf
from gpumem_gui.core.spec.params import count_params
from tests.gguf_files import Q, Tensors, write_gguf


def _layers(n: int, per_layer: Callable[[int], Tensors]) -> Tensors:
    out: Tensors = {}
    for i in range(n):
        out |= per_layer(i)
    return out


def test_qwen2moe(tmp_path: Path) -> None:
    h, e, fe, fs, ff = 32, 4, 16, 24, 48

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(h)
        w.add_block_count(2)
        w.add_head_count(4)
        w.add_head_count_kv(2)
        w.add_feed_forward_length(ff)
        w.add_expert_count(e)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(fe)
        w.add_expert_shared_feed_forward_length(fs)
        w.add_context_length(64)

    def layer(i: int) -> Tensors:
        b = f"blk.{i}"
        return {
            f"{b}.attn_norm.weight": ((h,), Q.F32),
            f"{b}.attn_q.weight": ((h, h), Q.F32),
            f"{b}.attn_q.bias": ((h,), Q.F32),
            f"{b}.attn_k.weight": ((16, h), Q.F32),
            f"{b}.attn_k.bias": ((16,), Q.F32),
            f"{b}.attn_v.weight": ((16, h), Q.F32),
            f"{b}.attn_v.bias": ((16,), Q.F32),
            f"{b}.attn_output.weight": ((h, h), Q.F32),
            f"{b}.ffn_norm.weight": ((h,), Q.F32),
            f"{b}.ffn_gate_inp.weight": ((e, h), Q.F32),
            f"{b}.ffn_gate_exps.weight": ((e, fe, h), Q.F32),
            f"{b}.ffn_up_exps.weight": ((e, fe, h), Q.F32),
            f"{b}.ffn_down_exps.weight": ((e, h, fe), Q.F32),
            f"{b}.ffn_gate_inp_shexp.weight": ((h,), Q.F32),
            f"{b}.ffn_gate_shexp.weight": ((fs, h), Q.F32),
            f"{b}.ffn_up_shexp.weight": ((fs, h), Q.F32),
            f"{b}.ffn_down_shexp.weight": ((h, fs), Q.F32),
        }

    tensors = (
        {"token_embd.weight": ((50, h), Q.F32)} | _layers(2, layer) | {"output_norm.weight": ((h,), Q.F32)}
    )
    tensors["output.weight"] = ((50, h), Q.F32)
    inv, spec = load_gguf(write_gguf(tmp_path / "q.gguf", "qwen2moe", meta, tensors), cross_check=True)
    assert spec is not None
    assert spec.model_type == "qwen2_moe"
    assert spec.qkv_bias and not spec.o_bias
    assert spec.moe is not None
    assert spec.moe.model_dump(include={"num_experts", "experts_per_token", "expert_intermediate_size"}) == {
        "num_experts": e,
        "experts_per_token": 2,
        "expert_intermediate_size": fe,
    }
    assert (spec.moe.shared_expert_intermediate_size, spec.moe.shared_expert_gate) == (fs, True)
    assert spec.moe.dense_layers == ()
    counts = count_params(spec)
    assert counts.total == inv.total_elements
    assert counts.by_component["routed_experts"] == inv.elements_by_component["routed_experts"]
    assert counts.by_component["shared_experts"] == inv.elements_by_component["shared_experts"]
    assert counts.by_component["router"] == inv.elements_by_component["router"]


def test_deepseek2_mla(tmp_path: Path) -> None:
    h, a, q_lora, kv_lora, nope, rope, v, e, fe, ff = 32, 4, 24, 16, 8, 4, 8, 4, 8, 40

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(h)
        w.add_block_count(2)
        w.add_head_count(a)
        w.add_head_count_kv(1)
        w.add_feed_forward_length(ff)
        w.add_key_length(kv_lora + rope)  # the compressed-cache layout of current llama.cpp files
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
        w.add_rope_dimension_count(rope)
        w.add_q_lora_rank(q_lora)
        w.add_kv_lora_rank(kv_lora)
        w.add_expert_count(e)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(fe)
        w.add_expert_shared_count(1)
        w.add_leading_dense_block_count(1)

    def layer(i: int) -> Tensors:
        b = f"blk.{i}"
        t: Tensors = {
            f"{b}.attn_norm.weight": ((h,), Q.F32),
            f"{b}.attn_q_a.weight": ((q_lora, h), Q.F32),
            f"{b}.attn_q_a_norm.weight": ((q_lora,), Q.F32),
            f"{b}.attn_q_b.weight": ((a * (nope + rope), q_lora), Q.F32),
            f"{b}.attn_kv_a_mqa.weight": ((kv_lora + rope, h), Q.F32),
            f"{b}.attn_kv_a_norm.weight": ((kv_lora,), Q.F32),
            f"{b}.attn_k_b.weight": ((a, kv_lora, nope), Q.F32),
            f"{b}.attn_v_b.weight": ((a, v, kv_lora), Q.F32),
            f"{b}.attn_output.weight": ((h, a * v), Q.F32),
            f"{b}.ffn_norm.weight": ((h,), Q.F32),
        }
        if i == 0:
            return t | {
                f"{b}.ffn_gate.weight": ((ff, h), Q.F32),
                f"{b}.ffn_up.weight": ((ff, h), Q.F32),
                f"{b}.ffn_down.weight": ((h, ff), Q.F32),
            }
        return t | {
            f"{b}.ffn_gate_inp.weight": ((e, h), Q.F32),
            f"{b}.exp_probs_b.bias": ((e,), Q.F32),
            f"{b}.ffn_gate_exps.weight": ((e, fe, h), Q.F32),
            f"{b}.ffn_up_exps.weight": ((e, fe, h), Q.F32),
            f"{b}.ffn_down_exps.weight": ((e, h, fe), Q.F32),
            f"{b}.ffn_gate_shexp.weight": ((fe, h), Q.F32),
            f"{b}.ffn_up_shexp.weight": ((fe, h), Q.F32),
            f"{b}.ffn_down_shexp.weight": ((h, fe), Q.F32),
        }

    tensors = {"token_embd.weight": ((64, h), Q.F32)} | _layers(2, layer)
    tensors |= {"output_norm.weight": ((h,), Q.F32), "output.weight": ((64, h), Q.F32)}
    inv, spec = load_gguf(write_gguf(tmp_path / "d.gguf", "deepseek2", meta, tensors), cross_check=True)
    assert spec is not None
    assert spec.model_type == "deepseek_v3"
    assert spec.mla is not None
    assert spec.mla.model_dump() == {
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        "indexer": None,  # DeepSeek-V3.2's sparse-attention indexer: not in a deepseek2 GGUF
        "head_gate": False,  # Bailing's g_proj output gate: not in a deepseek2 GGUF
    }
    assert (spec.num_kv_heads, spec.head_dim, spec.norms_per_layer) == (a, nope + rope, 2)
    assert spec.moe is not None
    assert (spec.moe.dense_layers, spec.moe.shared_expert_intermediate_size) == ((0,), fe)
    # DeepSeek-V3's e_score_correction_bias (GGUF exp_probs_b) is a buffer, not a parameter, in transformers
    assert count_params(spec).total + e == inv.total_elements


def test_gpt2_learned_positions(tmp_path: Path) -> None:
    h, ff, n_pos, vocab = 32, 128, 24, 50

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(h)
        w.add_block_count(1)
        w.add_head_count(4)
        w.add_feed_forward_length(ff)
        w.add_context_length(n_pos)

    tensors: Tensors = {"token_embd.weight": ((vocab, h), Q.F16), "position_embd.weight": ((n_pos, h), Q.F32)}
    for n, shape in {
        "attn_norm": (h,),
        "attn_qkv": (3 * h, h),
        "attn_output": (h, h),
        "ffn_norm": (h,),
        "ffn_up": (ff, h),
        "ffn_down": (h, ff),
    }.items():
        tensors[f"blk.0.{n}.weight"] = (shape, Q.F32)
        tensors[f"blk.0.{n}.bias"] = ((shape[0],), Q.F32)
    tensors |= {"output_norm.weight": ((h,), Q.F32), "output_norm.bias": ((h,), Q.F32)}
    inv, spec = load_gguf(write_gguf(tmp_path / "g.gguf", "gpt2", meta, tensors), cross_check=True)
    assert spec is not None
    assert (spec.position_embedding, spec.learned_position_rows, spec.max_position_embeddings) == (
        "learned",
        n_pos,
        n_pos,
    )
    assert (spec.norm, spec.norm_bias, spec.mlp_gated, spec.tie_word_embeddings) == (
        "layernorm",
        True,
        False,
        True,
    )
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias
    assert count_params(spec).total == inv.total_elements
    assert inv.bytes_by_component["position_embedding"] == n_pos * h * 4


def test_gemma3_sliding_pattern(tmp_path: Path) -> None:
    h, a, kv, hd, ff, n = 32, 4, 1, 16, 64, 7

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(h)
        w.add_block_count(n)
        w.add_head_count(a)
        w.add_head_count_kv(kv)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_feed_forward_length(ff)
        w.add_sliding_window(512)

    def layer(i: int) -> Tensors:
        b = f"blk.{i}"
        return {
            f"{b}.attn_norm.weight": ((h,), Q.F32),
            f"{b}.attn_q.weight": ((a * hd, h), Q.F32),
            f"{b}.attn_k.weight": ((kv * hd, h), Q.F32),
            f"{b}.attn_v.weight": ((kv * hd, h), Q.F32),
            f"{b}.attn_output.weight": ((h, a * hd), Q.F32),
            f"{b}.attn_q_norm.weight": ((hd,), Q.F32),
            f"{b}.attn_k_norm.weight": ((hd,), Q.F32),
            f"{b}.post_attention_norm.weight": ((h,), Q.F32),
            f"{b}.ffn_norm.weight": ((h,), Q.F32),
            f"{b}.ffn_gate.weight": ((ff, h), Q.F32),
            f"{b}.ffn_up.weight": ((ff, h), Q.F32),
            f"{b}.ffn_down.weight": ((h, ff), Q.F32),
            f"{b}.post_ffw_norm.weight": ((h,), Q.F32),
        }

    tensors = (
        {"token_embd.weight": ((100, h), Q.F32)} | _layers(n, layer) | {"output_norm.weight": ((h,), Q.F32)}
    )
    inv, spec = load_gguf(write_gguf(tmp_path / "g3.gguf", "gemma3", meta, tensors), cross_check=True)
    assert spec is not None
    assert spec.model_type == "gemma3_text"
    assert (spec.norms_per_layer, spec.qk_norm, spec.tie_word_embeddings, spec.head_dim) == (
        4,
        "per_head",
        True,
        hd,
    )
    assert spec.activation == "gelu_pytorch_tanh"
    assert spec.sliding_window == 512
    assert spec.layer_types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    assert count_params(spec).total == inv.total_elements


def test_explicit_sliding_pattern_and_phi3_fused(tmp_path: Path) -> None:
    h, a, ff, n = 32, 4, 40, 2

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(h)
        w.add_block_count(n)
        w.add_head_count(a)
        w.add_feed_forward_length(ff)
        w.add_sliding_window(16)
        w.add_sliding_window_pattern([False, True])

    def layer(i: int) -> Tensors:
        b = f"blk.{i}"
        return {
            f"{b}.attn_norm.weight": ((h,), Q.F32),
            f"{b}.attn_qkv.weight": ((3 * h, h), Q.F32),
            f"{b}.attn_output.weight": ((h, h), Q.F32),
            f"{b}.ffn_norm.weight": ((h,), Q.F32),
            f"{b}.ffn_up.weight": ((2 * ff, h), Q.F32),  # gate and up fused
            f"{b}.ffn_down.weight": ((h, ff), Q.F32),
        }

    tensors = {"token_embd.weight": ((10, h), Q.F32)} | _layers(n, layer)
    tensors |= {"output_norm.weight": ((h,), Q.F32), "output.weight": ((10, h), Q.F32)}
    inv, spec = load_gguf(write_gguf(tmp_path / "p.gguf", "phi3", meta, tensors), cross_check=True)
    assert spec is not None
    assert spec.model_type == "phi3"
    assert spec.mlp_gated is True
    assert spec.layer_types == ("full_attention", "sliding_attention")
    assert count_params(spec).total == inv.total_elements
