"""GGUF headers -> WeightsInventory and ModelSpec, checked on tiny files written with gguf.GGUFWriter."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.gguf import inventory_from_gguf, load_gguf, spec_from_gguf
from gpumem_gui.core.spec.params import count_params

Q = gguf.GGMLQuantizationType

# Bytes per block and elements per block, written out from ggml's block structs
# (ggml/src/ggml-common.h): block_q8_0 = fp16 scale + 32 int8 (34 B / 32), block_q4_K = two fp16 +
# 12 bytes of 6-bit scales + 128 bytes of nibbles (144 B / 256).
BLOCK = {Q.F32: (1, 4), Q.F16: (1, 2), Q.Q8_0: (32, 34), Q.Q4_K: (256, 144)}


def nbytes(qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = BLOCK[qtype]
    n = 1
    for d in shape:
        n *= d
    assert shape[-1] % block == 0
    return n // block * size


Tensors = dict[str, tuple[tuple[int, ...], gguf.GGMLQuantizationType]]


def write_gguf(
    path: Path, arch: str, meta: Callable[[gguf.GGUFWriter], None], tensors: Tensors, n_tokens: int = 0
) -> Path:
    """A GGUF file with ``tensors`` (name -> row-major shape, type) filled with zero bytes."""
    w = gguf.GGUFWriter(path, arch)
    meta(w)
    if n_tokens:
        w.add_token_list([f"t{i}" for i in range(n_tokens)])
    for name, (shape, qtype) in tensors.items():
        if qtype == Q.F32:
            w.add_tensor(name, np.zeros(shape, np.float32))
        elif qtype == Q.F16:
            w.add_tensor(name, np.zeros(shape, np.float16))
        else:
            block, size = BLOCK[qtype]
            raw = np.zeros((*shape[:-1], shape[-1] // block * size), np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- a tiny Llama, mixed quantization -----------------------------------------------------------------

H, LAYERS, HEADS, KV, HD, FF, VOCAB, CTX = 256, 2, 4, 2, 64, 512, 40, 128


def llama_meta(w: gguf.GGUFWriter) -> None:
    w.add_name("tiny-llama")
    w.add_context_length(CTX)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(HD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)


def llama_tensors(tied: bool = False) -> Tensors:
    t: Tensors = {"token_embd.weight": ((VOCAB, H), Q.F16)}
    for i in range(LAYERS):
        b = f"blk.{i}"
        t |= {
            f"{b}.attn_norm.weight": ((H,), Q.F32),
            f"{b}.attn_q.weight": ((HEADS * HD, H), Q.Q4_K),
            f"{b}.attn_k.weight": ((KV * HD, H), Q.Q4_K),
            f"{b}.attn_v.weight": ((KV * HD, H), Q.Q8_0),
            f"{b}.attn_output.weight": ((H, HEADS * HD), Q.Q4_K),
            f"{b}.ffn_norm.weight": ((H,), Q.F32),
            f"{b}.ffn_gate.weight": ((FF, H), Q.Q4_K),
            f"{b}.ffn_up.weight": ((FF, H), Q.Q4_K),
            f"{b}.ffn_down.weight": ((H, FF), Q.Q8_0),
        }
    t["output_norm.weight"] = ((H,), Q.F32)
    if not tied:
        t["output.weight"] = ((VOCAB, H), Q.Q8_0)
    return t


def _expected(tensors: Tensors) -> tuple[dict[str, int], dict[str, int], int]:
    by_type: dict[str, int] = {}
    el_type: dict[str, int] = {}
    for shape, qtype in tensors.values():
        by_type[qtype.name] = by_type.get(qtype.name, 0) + nbytes(qtype, shape)
        el_type[qtype.name] = el_type.get(qtype.name, 0) + int(np.prod(shape))
    return by_type, el_type, sum(by_type.values())


def test_llama_inventory_exact(tmp_path: Path) -> None:
    tensors = llama_tensors()
    f = write_gguf(tmp_path / "tiny.gguf", "llama", llama_meta, tensors, n_tokens=VOCAB)
    inv = inventory_from_gguf(f, cross_check=True)
    by_type, el_type, total = _expected(tensors)
    assert inv.format == "gguf"
    assert inv.files == (str(f),)
    assert inv.quantization == "Q4_K_M"
    assert inv.tensor_count == len(tensors)
    assert inv.bytes_by_dtype == dict(sorted(by_type.items()))
    assert inv.elements_by_dtype == dict(sorted(el_type.items()))
    assert inv.total_bytes == total
    # by hand, per layer: q and o 256 rows x 1 block of 144 B, k 128 x 144, v (Q8_0) 128 rows x 8 x 34
    assert inv.bytes_by_component["attention"] == LAYERS * (256 * 144 + 128 * 144 + 128 * 8 * 34 + 256 * 144)
    assert inv.bytes_by_component["mlp"] == LAYERS * (2 * 512 * 144 + 256 * 16 * 34)
    assert inv.bytes_by_component["norms"] == (2 * LAYERS + 1) * H * 4
    assert inv.bytes_by_component["embedding"] == VOCAB * H * 2
    assert inv.bytes_by_component["lm_head"] == VOCAB * 8 * 34
    assert inv.bytes_by_component["other"] == 0
    q = inv.tensor("blk.1.attn_q.weight")
    assert q is not None
    assert (q.dtype, q.shape, q.elements, q.nbytes, q.component, q.layer) == (
        "Q4_K",
        (HEADS * HD, H),
        HEADS * HD * H,
        256 * 144,
        "attention",
        1,
    )
    assert f.stat().st_size > total  # header + padding on top of the tensor bytes


def test_llama_spec(tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "tiny.gguf", "llama", llama_meta, llama_tensors(), n_tokens=VOCAB)
    inv, spec = load_gguf(f, cross_check=True)
    assert spec is not None
    assert spec == spec_from_gguf(f)
    assert spec.name == "tiny-llama"
    assert (spec.model_type, spec.hidden_size, spec.num_layers) == ("llama", H, LAYERS)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (HEADS, KV, HD)
    assert (spec.intermediate_size, spec.vocab_size, spec.max_position_embeddings) == (FF, VOCAB, CTX)
    assert spec.tie_word_embeddings is False
    assert (spec.norm, spec.norms_per_layer, spec.mlp_gated, spec.qkv_bias) == ("rmsnorm", 2, True, False)
    assert spec.moe is None and spec.mla is None and spec.layer_types == ()
    assert spec.provenance.kind == "gguf"
    assert spec.provenance.source == str(f)
    # the spec's exact parameter count is the file's logical element count
    assert count_params(spec).total == inv.total_elements


def test_tied_head_and_vocab_from_tokens(tmp_path: Path) -> None:
    tensors = llama_tensors(tied=True)
    del tensors["token_embd.weight"]  # vocab must then come from tokenizer.ggml.tokens
    f = write_gguf(tmp_path / "tied.gguf", "llama", llama_meta, tensors, n_tokens=VOCAB)
    spec = spec_from_gguf(f)
    assert spec is not None
    assert spec.tie_word_embeddings is True
    assert spec.vocab_size == VOCAB


def test_per_layer_kv_heads_and_vocab_key(tmp_path: Path) -> None:
    def meta(w: gguf.GGUFWriter) -> None:
        llama_meta(w)
        w.add_vocab_size(VOCAB)

    f = write_gguf(tmp_path / "a.gguf", "llama", meta, llama_tensors())
    spec = spec_from_gguf(f)
    assert spec is not None and spec.vocab_size == VOCAB

    def uniform(w: gguf.GGUFWriter) -> None:
        w.add_context_length(CTX)
        w.add_embedding_length(H)
        w.add_block_count(LAYERS)
        w.add_feed_forward_length(FF)
        w.add_head_count(HEADS)
        w.add_head_count_kv([KV] * LAYERS)

    spec = spec_from_gguf(write_gguf(tmp_path / "b.gguf", "llama", uniform, llama_tensors()))
    assert spec is not None and spec.num_kv_heads == KV

    def varying(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(H)
        w.add_block_count(LAYERS)
        w.add_feed_forward_length(FF)
        w.add_head_count(HEADS)
        w.add_head_count_kv([KV, 1])

    f = write_gguf(tmp_path / "c.gguf", "llama", varying, llama_tensors())
    assert spec_from_gguf(f) is None  # one num_kv_heads cannot describe it
    assert inventory_from_gguf(f).tensor_count == len(llama_tensors())


def test_unknown_architecture_gives_no_spec(tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "x.gguf", "rwkv6", lambda w: w.add_block_count(1), {"a.weight": ((32,), Q.F32)})
    inv, spec = load_gguf(f)
    assert spec is None
    assert inv.total_bytes == 128
    assert inv.quantization is None
    assert inv.bytes_by_component["other"] == 128


def test_missing_required_key(tmp_path: Path) -> None:
    def meta(w: gguf.GGUFWriter) -> None:
        w.add_block_count(LAYERS)
        w.add_head_count(HEADS)

    f = write_gguf(tmp_path / "m.gguf", "llama", meta, llama_tensors())
    with pytest.raises(GpumemInputError, match=r"field 'llama\.embedding_length': required key is missing"):
        spec_from_gguf(f)
    assert inventory_from_gguf(f).tensor_count == len(llama_tensors())


def test_inconsistent_heads_is_input_error(tmp_path: Path) -> None:
    def bad(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(H)
        w.add_block_count(LAYERS)
        w.add_feed_forward_length(FF)
        w.add_head_count(HEADS)
        w.add_head_count_kv(3)

    with pytest.raises(GpumemInputError, match="num_kv_heads"):
        spec_from_gguf(write_gguf(tmp_path / "b.gguf", "llama", bad, llama_tensors()))


def test_block_count_must_match_the_tensors(tmp_path: Path) -> None:
    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(H)
        w.add_block_count(3_000_000_000)  # would drive per-layer loops for hours if trusted
        w.add_feed_forward_length(FF)
        w.add_head_count(HEADS)

    f = write_gguf(tmp_path / "b.gguf", "llama", meta, llama_tensors())
    with pytest.raises(
        GpumemInputError, match=r"'llama\.block_count': is 3000000000 but the file has tensors for 2"
    ):
        spec_from_gguf(f)
    tensors = llama_tensors()
    tensors["blk.5.attn_norm.weight"] = ((H,), Q.F32)
    f = write_gguf(tmp_path / "gap.gguf", "llama", llama_meta, tensors)
    with pytest.raises(GpumemInputError, match="gaps in their numbering"):
        spec_from_gguf(f)


def test_vocab_only_file_has_no_spec(tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "vocab.gguf", "llama", llama_meta, {}, n_tokens=VOCAB)
    inv, spec = load_gguf(f)
    assert (inv.tensor_count, inv.total_bytes, spec) == (0, 0, None)


# ---- other architectures: the spec's parameter count must equal the file's element count -----------------


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


# ---- malformed files ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("gguf-valid")
    tensors: Tensors = {
        "token_embd.weight": ((4, 256), Q.F16),
        "blk.0.attn_norm.weight": ((256,), Q.F32),
        "blk.0.attn_q.weight": ((256, 256), Q.Q4_K),
        "blk.0.ffn_down.weight": ((256, 64), Q.Q8_0),
    }

    def meta(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(256)
        w.add_block_count(1)
        w.add_head_count(4)
        w.add_feed_forward_length(64)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
        w.add_array("x.floats", [1.0, 2.0])

    return write_gguf(d / "v.gguf", "llama", meta, tensors, n_tokens=4).read_bytes()


def _kv_header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"GGU", "not a GGUF file (magic b'GGU'"),
        (b"PK\x03\x04" + b"\0" * 40, "not a GGUF file (magic b'PK\\x03\\x04'"),
        (b"GGUF\x03\0\0\0", "file is truncated"),
        (_kv_header(0, 0, version=1), "unsupported GGUF version 1"),
        (_kv_header(0, 0, version=7), "unsupported GGUF version 7"),
        (_kv_header(2**40, 0), "header claims 0 metadata entries and 1099511627776 tensors"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 0, 10**12) + b"\0" * 16, "file is truncated"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 8, 10**6) + b"\0" * 16, "file is truncated"),
        (
            _kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 16,
            "nested arrays are not supported",
        ),
        (_kv_header(0, 1) + _s("a") + struct.pack("<I", 77) + b"\0" * 16, "unknown value type 77"),
        (_kv_header(0, 1) + _s("a") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 16, "unknown item type 77"),
        (_kv_header(0, 2) + _s("a") + struct.pack("<IB", 0, 1) + _s("a") + struct.pack("<IB", 0, 1), "twice"),
        (_kv_header(0, 1) + struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<IB", 0, 1), "not valid UTF-8"),
        (_kv_header(0, 1) + _s("general.alignment") + struct.pack("<IQ", 10, 32), "must be a UINT32"),
        (_kv_header(0, 1) + _s("general.alignment") + struct.pack("<II", 4, 24), "must be a power of two"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<I", 5) + b"\0" * 60, "at most 4"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 4, 99, 0) + b"\0" * 32, "unknown ggml type 99"),
        (
            _kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 33, 8, 0) + b"\0" * 64,
            "not a multiple of the Q8_0",
        ),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQQIQ", 2, 2**62, 4, 0, 0), "overflow"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQQIQ", 2, 4, 0, 0, 0), "invalid dimension in [4, 0]"),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 2**63, 0, 0), "invalid dimension"),
        (
            _kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 4, 0, 4) + b"\0" * 32,
            "not a multiple of the alignment",
        ),
        (_kv_header(1, 0) + _s("t") + struct.pack("<IQIQ", 1, 64, 0, 0) + b"\0" * 40, "data ends at byte"),
        (
            _kv_header(2, 0) + (_s("t") + struct.pack("<IQIQ", 1, 1, 0, 0)) * 2 + b"\0" * 64,
            "tensor 't' appears twice",
        ),
    ],
)
def test_malformed(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.gguf"
    f.write_bytes(content)
    for fn in (inventory_from_gguf, spec_from_gguf):
        with pytest.raises(GpumemInputError) as ei:
            fn(f)
        assert message in str(ei.value)
        assert str(f) in str(ei.value)


def test_truncated_tensor_data(tmp_path: Path, valid_bytes: bytes) -> None:
    f = tmp_path / "t.gguf"
    f.write_bytes(valid_bytes[:-100])
    with pytest.raises(
        GpumemInputError, match=r"file is truncated: tensor 'blk\.0\.ffn_down\.weight' data ends"
    ):
        inventory_from_gguf(f)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GpumemInputError, match="no such file"):
        inventory_from_gguf(tmp_path / "nope.gguf")


def test_big_endian_file(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "be.gguf", "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_norm.weight", np.zeros((64,), np.float32), tensor_endianess=gguf.GGUFEndian.BIG)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    inv = inventory_from_gguf(tmp_path / "be.gguf", cross_check=True)
    assert (inv.tensor_count, inv.total_bytes, inv.bytes_by_component["norms"]) == (1, 256, 256)


# ---- fuzzing: the only exception allowed out is GpumemInputError -------------------------------------------

_FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-fuzz") / "fuzz.gguf"


def _try(f: Path, content: bytes) -> None:
    f.write_bytes(content)
    try:
        inv, _spec = load_gguf(f)
    except GpumemInputError as e:
        assert str(f) in str(e)
        return
    assert inv.total_bytes == sum(t.nbytes for t in inv.tensors)
    # gguf.GGUFReader must read every file the parser accepts, and agree with it
    assert load_gguf(f, cross_check=True)[0] == inv


@_FUZZ
@given(data=st.data())
def test_fuzz_mutated_bytes(fuzz_file: Path, valid_bytes: bytes, data: st.DataObject) -> None:
    # mostly in the header, where the structure is; the data section is zeros either way
    header_end = min(len(valid_bytes), 900)
    mutations = data.draw(
        st.lists(st.tuples(st.integers(0, header_end - 1), st.integers(0, 255)), min_size=1, max_size=6)
    )
    b = bytearray(valid_bytes)
    for pos, val in mutations:
        b[pos] = val
    _try(fuzz_file, bytes(b))


@_FUZZ
@given(data=st.data())
def test_fuzz_truncated(fuzz_file: Path, valid_bytes: bytes, data: st.DataObject) -> None:
    _try(fuzz_file, valid_bytes[: data.draw(st.integers(0, len(valid_bytes)))])


@_FUZZ
@given(
    version=st.sampled_from([1, 2, 3, 4, 0x03000000]),
    n_tensors=st.integers(0, 2**64 - 1) | st.integers(0, 3),
    n_kv=st.integers(0, 2**64 - 1) | st.integers(0, 3),
    rest=st.binary(max_size=200),
)
def test_fuzz_random_headers(fuzz_file: Path, version: int, n_tensors: int, n_kv: int, rest: bytes) -> None:
    _try(fuzz_file, b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + rest)


@_FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "llama.embedding_length",
                    "llama.block_count",
                    "llama.attention.head_count",
                    "llama.attention.head_count_kv",
                    "llama.feed_forward_length",
                    "general.architecture",
                    "general.alignment",
                    "llama.vocab_size",
                    "llama.attention.key_length",
                ]
            ),
            st.integers(0, 12),
            st.integers(0, 2**32 - 1),
        ),
        max_size=6,
        unique_by=lambda kv: kv[0],
    )
)
def test_fuzz_metadata_values(fuzz_file: Path, kvs: list[tuple[str, int, int]]) -> None:
    """Well-formed files with arbitrary metadata values: spec building must fail cleanly too."""
    body = b""
    for key, vtype, value in kvs:
        body += _s(key) + struct.pack("<I", vtype)
        if vtype == 8:
            body += _s(str(value))
        elif vtype == 9:
            body += struct.pack("<IQ", 4, 2) + struct.pack("<II", value, value)
        elif vtype in (10, 11, 12):
            body += struct.pack("<Q", value)
        elif vtype in (0, 1, 7):
            body += struct.pack("<B", value & 0xFF)
        elif vtype in (2, 3):
            body += struct.pack("<H", value & 0xFFFF)
        else:
            body += struct.pack("<I", value)
    arch = _s("general.architecture") + struct.pack("<I", 8) + _s("llama")
    n_kv = len(kvs) + (0 if any(k == "general.architecture" for k, _, _ in kvs) else 1)
    if n_kv > len(kvs):
        body = arch + body
    tensor = _s("blk.0.attn_norm.weight") + struct.pack("<IQIQ", 1, 8, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, n_kv) + body + tensor
    _try(fuzz_file, head + b"\0" * (-len(head) % 32) + b"\0" * 64)
