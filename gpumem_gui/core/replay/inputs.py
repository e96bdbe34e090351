"""What a forward builds before the decoder layers: the embeddings (scaled, projected, with learned positions
and their dropout), the rotary tables, ALiBi, and the attention masks (``masking_utils``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, chunked, gptj, mrope, rope_partial
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.spec.linear import STATE_LAYER_TYPES

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def embed(m: CausalLM, ids: T) -> tuple[T, list[T]]:
    """The first layer's input, and the locals the model's forward keeps until it returns: the token
    embedding (scaled inside the module, Gemma; projected, OPT-350m's project_in), the learned positions
    (GPT-2 wpe, OPT embed_positions) added into a new tensor, embedding dropout (GPT-2, GPT-NeoX), the
    embedding norm (BLOOM word_embeddings_layernorm)."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    s.hooks.module_forward(s, "embedding", True)  # FSDP2: an embedding unit of its own is gathered
    w = m.param("embed_tokens.weight")
    inputs_embeds = s.new(cfg.tokens * spec.token_embedding_dim, w.dt)
    s.node("copy", (w,), (inputs_embeds,), (ids,))
    del w
    s.hooks.module_forward(s, "embedding", False)
    if spec.traits.embedding_scale:
        inputs_embeds = o.mul(inputs_embeds, None)
    if m.has("project_in.weight"):
        inputs_embeds = m.linear(inputs_embeds, "project_in")
    keep = [inputs_embeds]
    hidden_states = inputs_embeds
    if spec.position_embedding == "learned":
        pw = m.param("embed_positions.weight")
        pos = s.new(cfg.q * spec.hidden_size, pw.dt)
        s.node("copy", (pw,), (pos,))
        keep.append(pos)
        hidden_states = o.add(inputs_embeds, pos)
        del pos
    if spec.traits.embedding_dropout:
        hidden_states = o.dropout(hidden_states, cfg.dropout)
    if m.has("embedding_norm.weight"):
        hidden_states = m.norm(hidden_states, "embedding_norm")
    return hidden_states, keep


def rotary(m: CausalLM, x: T) -> tuple[T | None, T | None]:
    """LlamaRotaryEmbedding.forward: fp32 cos/sin [1, q, d], cast to the hidden states' dtype."""
    spec, s = m.spec, m.s
    if spec.position_embedding != "rope":
        return None, None
    if spec.traits.rope_complex:  # Llama4TextRotaryEmbedding: one complex64 table
        return chunked.complex_rotary(m)
    if spec.traits.attention_code == "gptj":  # GPTJRotaryEmbedding: one sin/cos table (replay/gptj.py)
        return gptj.rotary(m, x)
    if spec.traits.rotary_mrope:  # Qwen3_5TextRotaryEmbedding: per-row [b, q, d] tables
        return mrope.rotary(m, x)
    d = rope_partial.rotary_width(spec)  # MLA's rope head, a partial rotary width, or head_dim
    n = m.cfg.q * (d // 2 if spec.traits.rotary_half_tables else d)  # GptOssRotaryEmbedding: no cat
    dt = "f32" if spec.traits.rope_fp32 or spec.traits.rope_tables_fp32 else x.dt  # Ernie4_5, Olmo3: fp32
    cos = s.cast(s.new(n, "f32"), dt)
    sin = s.cast(s.new(n, "f32"), dt)
    return cos, sin


def rotary_kinds(m: CausalLM, layers: Sequence[int]) -> tuple[str, ...]:
    """One rotary embedding, or one per attention type present (Gemma-3's global and local)."""
    if m.spec.position_embedding != "rope":
        return ()
    if not m.spec.traits.rotary_per_layer_type:
        return ("full_attention",)
    types = m.spec.resolved_layer_types
    return tuple(sorted({types[i] for i in layers}))


def alibi(m: CausalLM, dt: str) -> T | None:
    """The ALiBi bias the model builds once (BloomModel, FalconModel: [b * heads, 1, kv] in the activation
    dtype), kept until it returns."""
    spec, cfg = m.spec, m.cfg
    if spec.position_embedding != "alibi":
        return None
    return m.s.new(cfg.batch * spec.num_attention_heads * cfg.kv_len, dt)


def masks(m: CausalLM, dt: str) -> dict[str, T]:
    """create_causal_mask / create_sliding_window_causal_mask (masking_utils): eager gets a float
    [b, 1, q, kv] mask per layer kind; sdpa needs none for causal layers (is_causal) and a boolean one for
    sliding layers once the keys reach the window (_ignore_causal_mask_sdpa)."""
    s, cfg = m.s, m.cfg
    out: dict[str, T] = {}
    kinds = set(m.spec.resolved_layer_types)
    unused = None
    if m.spec.traits.sliding_mask_always and "sliding_attention" not in kinds:
        # built and held by the model's forward though no layer reads it (Qwen2MoeModel)
        unused = s.new(cfg.batch * cfg.q * cfg.kv_len, dt if cfg.attn == "eager" else "bool")
    for kind in sorted(kinds - STATE_LAYER_TYPES):  # create_recurrent_attention_mask: None unpadded
        if kind == "chunked_attention":  # create_chunked_causal_mask (replay/chunked.py)
            if (chunk_mask := chunked.chunked_mask(m, dt)) is not None:
                out[kind] = chunk_mask
            continue
        if cfg.attn == "eager" or m.spec.traits.block == "bloom":  # BLOOM has eager attention only
            out[kind] = s.new(cfg.batch * cfg.q * cfg.kv_len, dt)
        elif attention.sdpa_mask(m.spec, cfg, kind == "sliding_attention"):
            out[kind] = s.new(attention.bool_mask_elems(m.spec, cfg), "bool")
    if unused is not None:
        out["unused"] = unused
    return out
