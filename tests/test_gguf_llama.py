"""GGUF headers -> WeightsInventory and ModelSpec for a tiny Llama with mixed quantization, and the spec's
errors on missing or inconsistent metadata."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.gguf import inventory_from_gguf, load_gguf, spec_from_gguf
from gpumem_gui.core.spec.params import count_params
from tests.gguf_files import Q, Tensors, nbytes, write_gguf

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
