"""KV-cache geometry: what one token costs in each layer's cache, and how many tokens a layer keeps.

Per layer and token a cache holds ``k_elems + v_elems`` elements:

* full or sliding attention (MHA/GQA/MQA): ``k = v = num_kv_heads x head_dim`` (never the hidden size);
* MLA, latent layout (transformers >= 5, vLLM, SGLang/FlashMLA): one compressed latent of
  ``kv_lora_rank`` plus the shared rope key of ``qk_rope_head_dim`` (no separate V);
* MLA, decompressed layout (older transformers, llama.cpp before its MLA support): per-head
  ``K = heads x (qk_nope + qk_rope)`` and ``V = heads x v_head_dim``.

Sliding-window layers in transformers' ``DynamicSlidingWindowLayer`` keep ``sliding_window - 1`` tokens
(``transformers/cache_utils.py``); verified against the reference measurements (Mistral-7B at 8192
tokens: 4095 per layer).
"""

from __future__ import annotations

from typing import Literal

from gpumem_gui.core.spec.gemma4 import kv_elems
from gpumem_gui.core.spec.linear import STATE_LAYER_TYPES
from gpumem_gui.core.spec.model import ModelSpec

MLALayout = Literal["latent", "decompressed"]


def kv_elements_per_token(
    spec: ModelSpec, mla_layout: MLALayout = "latent", *, transformers: bool = True
) -> tuple[int, int]:
    """(K elements, V elements) one token adds to one attention layer's cache.

    ``transformers=True`` follows what transformers stores, including Falcon's K/V broadcast to every
    query head (:attr:`ModelSpec.transformers_expands_kv`); runtimes with GQA-aware kernels store KV heads.
    """
    if spec.mla is not None:
        m = spec.mla
        # DSA: the indexer's own single-head key per token (DynamicIndexedLayer.indexer_keys) counted with K
        ix = m.indexer.head_dim if m.indexer is not None else 0
        if mla_layout == "latent":
            return m.kv_lora_rank + ix, m.qk_rope_head_dim
        a = spec.num_attention_heads
        return a * m.qk_head_dim + ix, a * m.v_head_dim
    if transformers and spec.transformers_expands_kv:
        width = spec.num_attention_heads * spec.head_dim
        return width, width
    return spec.kv_width, spec.kv_width


def kv_bytes_per_token_per_layer(
    spec: ModelSpec, bytes_per_element: float = 2, mla_layout: MLALayout = "latent"
) -> tuple[int, ...]:
    """Cache bytes one token costs in each layer (before any sliding-window cap)."""
    if spec.encoder is not None:  # an encoder keeps no KV cache (BertModel.forward: use_cache = False)
        return (0,) * spec.num_layers
    if spec.gemma4 is not None:  # Gemma 4: the full layers' own head dim and KV heads (spec/gemma4.py)
        return tuple(round(sum(kv_elems(spec, i)) * bytes_per_element) for i in range(spec.num_layers))
    k, v = kv_elements_per_token(spec, mla_layout)
    per = round((k + v) * bytes_per_element)
    ix = spec.mla.indexer if spec.mla is not None else None
    if ix is not None and ix.shared_layers:  # a layer sharing another's top-k caches no indexer key
        shared = round((k + v - ix.head_dim) * bytes_per_element)
        return tuple(per if ix.has_indexer(i) else shared for i in range(spec.num_layers))
    if spec.seq2seq is not None:  # encoder blocks cache nothing; decoder self-attention per target token
        enc = spec.seq2seq.encoder_layers
        return tuple(0 if i < enc else per for i in range(spec.num_layers))
    # linear-attention layers cache no keys or values, only a fixed state (spec/state.py)
    # a KV-shared layer reads an earlier layer's cache and keeps none (Gemma3nTextAttention)
    return tuple(
        0 if lt in STATE_LAYER_TYPES or i in spec.kv_shared_layers else per
        for i, lt in enumerate(spec.resolved_layer_types)
    )


def cache_window(spec: ModelSpec, layer_type: str) -> int | None:
    """The window of a layer kind's cache in transformers: ``sliding_window`` for sliding layers,
    ``attention_chunk_size`` for chunked ones (cache_utils DYNAMIC_LAYER_TYPE_MAPPING: both are a
    DynamicSlidingWindowLayer), None for full attention."""
    if layer_type == "sliding_attention":
        return spec.sliding_window
    if layer_type == "chunked_attention":
        return spec.attention_chunk_size
    return None


def tokens_kept_transformers(spec: ModelSpec, tokens: int) -> tuple[int, ...]:
    """Tokens each layer of transformers' DynamicCache holds after ``tokens`` tokens."""
    windows = (cache_window(spec, lt) for lt in spec.resolved_layer_types)
    kept = tuple(min(tokens, w - 1) if w else tokens for w in windows)
    # a LinearAttentionLayer keeps no tokens, only its fixed state (spec/state.py)
    return tuple(
        0 if lt in STATE_LAYER_TYPES or i in spec.kv_shared_layers else k
        for i, (k, lt) in enumerate(zip(kept, spec.resolved_layer_types, strict=True))
    )


def kv_cache_bytes_transformers(
    spec: ModelSpec, tokens: int, batch: int = 1, bytes_per_element: float = 2
) -> tuple[int, ...]:
    """Per-layer bytes of transformers' DynamicCache for ``batch`` sequences of ``tokens`` tokens."""
    per_token = kv_bytes_per_token_per_layer(spec, bytes_per_element)
    kept = tokens_kept_transformers(spec, tokens)
    return tuple(batch * p * t for p, t in zip(per_token, kept, strict=True))
