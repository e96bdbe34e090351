"""Self-attention as transformers 5.24 runs it, on symbolic tensors: projections, rotary, cache, kernel.

* ``LlamaAttention.forward``: q/k/v projections viewed into heads, optional q/k norms (Qwen3 per head, OLMo-2
  over the whole projection), rotary (``apply_rotary_pos_emb``: ``(x * cos) + (rotate_half(x) * sin)``), the
  cache update (the concatenations become the keys and values), the kernel, ``o_proj``. A fused projection
  (:attr:`ArchTraits.fused_qkv`) is one linear split into views.
* ``DeepseekV3Attention`` (MLA): low-rank q, the compressed latent and the shared rope key cached as they are,
  re-expanded by ``kv_b_proj`` for every cached token (``expand_kv``) before the kernel.
* Kernels (``integrations/sdpa_attention.py``, ``eager_attention_forward``): SDPA with grouped heads through
  ``enable_gqa`` when there is no mask, packed queries for a single token, else K/V repeated to every head;
  the fused kernel returns the output (already in [b, q, heads, d] layout) and an fp32 log-sum-exp; torch's
  math path (fp32 copies, fp32 scores) when the fused kernel cannot take the inputs (unequal head dims, K/V
  broadcast under a mask); eager: scores, scaling, mask, softmax (fp32 unless the architecture keeps the
  activation dtype), probabilities returned to the decoder layer.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import chunked, cohere, dsa, gptj, output_gate, rope_partial
from gpumem_gui.core.replay import sinks as _sinks  # noqa: F401  registers gpt-oss's eager kernel and rotary
from gpumem_gui.core.replay.attention_kernels import bool_mask_elems, kernel, rope, sdpa_mask, split
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import MIXERS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM

# the kernels and the pieces the attention variants share live in .attention_kernels (below the variants);
# these names stay importable from here for the blocks that call them as attention.<name>
__all__ = ["attention", "bool_mask_elems", "kernel", "rope", "sdpa_mask", "split"]


@register(MIXERS, "attention")
def attention(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """One layer's self-attention from its normed input; returns (output, attention weights or None)."""
    s = m.s
    prev, s.region = s.region, "attention"
    if dsa.applies(m):  # DeepseekV32Attention: MLA with the sparse-attention indexer (replay/dsa.py)
        out, weights = dsa.mla(m, i, x, cos, sin, mask)
    elif m.spec.mla is not None:
        out, weights = _mla(m, i, x, cos, sin, mask)
    elif m.spec.traits.attention_code == "gptj":  # GPTJAttention (replay/gptj.py)
        out, weights = gptj.attention(m, i, x, cos, sin, mask)
    else:
        out, weights = _mha(m, i, x, cos, sin, mask)
    if m.spec.traits.residual_dropout:
        out = m.o.dropout(out, m.cfg.dropout)
    s.region = prev
    return out, weights


def _mha(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    pre = f"layers.{i}.self_attn"
    t = cfg.tokens
    a, kvh, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    if m.has(f"{pre}.qkv_proj.weight"):
        # one fused projection split into views (GPT-2 c_attn, Phi-3 qkv_proj, Falcon query_key_value)
        qkv = m.linear(x, f"{pre}.qkv_proj")
        q, k, v = T(qkv.st, t * a * d, qkv.dt), T(qkv.st, t * kvh * d, qkv.dt), T(qkv.st, t * kvh * d, qkv.dt)
        s.node("split", (qkv,), (q, k, v))
        del qkv
        gate = None
    else:
        # Llama 4's weightless L2 q/k norm runs after the rotary (chunked.rotate_and_scale)
        norm_first = spec.qk_norm not in ("none", "l2") and not spec.traits.qk_norm_after_rope
        q, gate = output_gate.split_q(m, x, pre)  # Qwen3NextAttention: q_proj also yields an output gate
        if norm_first:
            q = m.norm(q, f"{pre}.q_norm")
        k = o.view(m.linear(x, f"{pre}.k_proj"), copy_grad=True)
        if norm_first:
            k = m.norm(k, f"{pre}.k_norm")
        v = o.view(m.linear(x, f"{pre}.v_proj"), copy_grad=True)
    if spec.traits.key_scaled:  # FalconH1Attention: key_states * key_multiplier
        k = o.mul(k, None)
    if chunked.applies(m):  # Llama4TextAttention: complex rotary, L2 q/k norm, temperature tuning
        q, k = chunked.rotate_and_scale(m, i, q, k, cos)
    elif cos is not None and sin is not None and i not in spec.nope_layers:  # NoPE layers skip the rotary
        if spec.traits.rope_upcast:  # Cohere2: fp32 copies of q and k (replay/cohere.py)
            q, k = cohere.rope(m, q, k, cos, sin)
        else:
            q, k = (rope_partial.partial_rope if rope_partial.applies(spec) else rope)(m, q, k, cos, sin)
    if spec.traits.query_position_scale:  # Ministral3Attention: query_states * get_llama_4_attn_scale(...)
        q = rope_partial.position_scale(m, q)
    if spec.traits.qk_norm_after_rope:  # HunYuanDenseV1Attention: query/key_layernorm after the rotary
        q = m.norm(q, f"{pre}.q_norm")
        k = m.norm(k, f"{pre}.k_norm")
    if spec.transformers_expands_kv:
        kvh = a  # FalconAttention broadcasts the grouped K/V to every head before the cache (a copy each)
        k, v = o.clone(k.view(t * a * d)), o.clone(v.view(t * a * d))
    if m.cache is not None:
        k, v = m.cache.update(i, k, v, cfg.q)
    out, weights = kernel(m, q, k, v, mask, a, kvh, d, d, layer=i)
    del q, k, v
    return m.linear(output_gate.apply(m, out, gate), f"{pre}.o_proj"), weights


def _mla(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """DeepseekV3Attention.forward and expand_kv (transformers 5.24). Every local of forward (q_states and
    its split views, compressed_kv, the normed latent or the cache's, the rotated parts, the query and the
    expanded key/value) lives until it returns, after o_proj; as ``replay/dsa.mla`` does for V3.2."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    ml = spec.mla
    assert ml is not None
    pre = f"layers.{i}.self_attn"
    b, t, a = cfg.batch, cfg.tokens, spec.num_attention_heads
    nope, rot, r, vd = ml.qk_nope_head_dim, ml.qk_rope_head_dim, ml.kv_lora_rank, ml.v_head_dim
    if m.has(f"{pre}.q_a_proj.weight"):
        q_states = m.linear(m.norm(m.linear(x, f"{pre}.q_a_proj"), f"{pre}.q_a_layernorm"), f"{pre}.q_b_proj")
    else:
        q_states = m.linear(x, f"{pre}.q_proj")
    q_states = o.view(q_states, copy_grad=True)
    # KimiLinearAttention (no rotary): the viewed q_states are the query, not split
    q_pass, q_rot = split(m, q_states, (t * a * nope, t * a * rot)) if cos is not None else (q_states, None)
    compressed_kv = m.linear(x, f"{pre}.kv_a_proj_with_mqa")
    kv_nope, k_rot = split(m, compressed_kv, (t * r, t * rot))
    kv_nope = m.norm(kv_nope, f"{pre}.kv_a_layernorm")
    if cos is not None and sin is not None:
        q_rot, k_rot = rope(m, q_rot, k_rot, cos, sin)
    if m.cache is not None:
        kv_nope, k_rot = m.cache.update(i, kv_nope, k_rot, cfg.q)
    query_states = o.cat(q_pass, q_rot) if q_rot is not None else q_pass
    if spec.traits.query_position_scale:  # Mistral4Attention: query_states * get_llama_4_attn_scale(...)
        query_states = rope_partial.position_scale(m, query_states)
    # expand_kv: kv_b_proj over every cached token, k_nope/value split into views, the rope key broadcast to
    # every head and copied with k_nope into a new key tensor
    kv = b * cfg.kv_len
    expanded = o.view(m.linear(kv_nope, f"{pre}.kv_b_proj"), copy_grad=True)
    k_nope, value_states = split(m, expanded, (kv * a * nope, kv * a * vd))
    del expanded
    key_states = s.new(kv * a * (nope + rot), query_states.dt)
    s.node("copy", (k_nope, k_rot), (key_states,))
    del k_nope
    out, weights = kernel(m, query_states, key_states, value_states, mask, a, a, nope + rot, vd)
    if ml.head_gate:  # BailingHybridAttention: out * sigmoid(g_proj(x).float()).to(dtype), per head
        g32 = s.cast(m.linear(x, f"{pre}.g_proj"), "f32")
        sig = s.new(g32.n, "f32")
        s.node("copy", (g32,), (sig,), (sig,))
        del g32
        out = o.mul(out, s.cast(sig, out.dt), out.n)
        del sig
    out = m.linear(out, f"{pre}.o_proj")
    del q_states, q_pass, q_rot, compressed_kv, kv_nope, k_rot, query_states, key_states, value_states
    return out, weights
