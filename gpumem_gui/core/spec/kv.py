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

from gpumem_gui.core.spec.kinds import Attention, CompressedAttention, LatentAttention, MLALayout
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

__all__ = [
    "MLALayout",
    "has_compressed_cache",
    "kv_bytes_per_token_per_layer",
    "kv_cache_bytes_transformers",
    "kv_elements_per_layer",
    "layer_windows",
    "tokens_kept_transformers",
]


def kv_elements_per_layer(
    spec: ModelSpec, mla_layout: MLALayout = "latent", *, transformers: bool = True
) -> tuple[tuple[int, int], ...]:
    """(K elements, V elements) one token adds to each layer's cache, from the layer kinds (spec/kinds.py):
    (0, 0) where a layer keeps no per-token cache (state, shared-KV, cross-attention, encoder layers).

    ``transformers=True`` follows what transformers stores, including Falcon's K/V broadcast to every
    query head (:attr:`ModelSpec.transformers_expands_kv`); runtimes with GQA-aware kernels store KV heads.
    """
    out = [(0, 0)] * spec.num_layers
    for kind in model_kinds(spec).attention:
        if isinstance(kind, LatentAttention):
            elems = kind.kv_elems(mla_layout)
        else:
            elems = kind.kv_elems(transformers=transformers)
        for i in kind.layers:
            out[i] = elems
    return tuple(out)


def kv_bytes_per_token_per_layer(
    spec: ModelSpec, bytes_per_element: float = 2, mla_layout: MLALayout = "latent"
) -> tuple[int, ...]:
    """Cache bytes one token costs in each layer (before any sliding-window cap)."""
    return tuple(round((k + v) * bytes_per_element) for k, v in kv_elements_per_layer(spec, mla_layout))


def layer_windows(spec: ModelSpec) -> tuple[int | None, ...]:
    """Each layer's cache window in transformers (``sliding_window`` for sliding layers,
    ``attention_chunk_size`` for chunked ones: cache_utils DYNAMIC_LAYER_TYPE_MAPPING makes both a
    DynamicSlidingWindowLayer), None for a full-attention layer or one without a per-token cache."""
    out: list[int | None] = [None] * spec.num_layers
    for kind in model_kinds(spec).attention:
        if isinstance(kind, Attention):
            for i in kind.layers:
                out[i] = kind.window
    return tuple(out)


def tokens_kept_transformers(spec: ModelSpec, tokens: int) -> tuple[int, ...]:
    """Tokens each layer of transformers' DynamicCache holds after ``tokens`` tokens (0 in a layer without
    a per-token cache: a LinearAttentionLayer keeps only its fixed state, spec/state.py)."""
    kinds = model_kinds(spec)
    return kinds.per_layer(lambda k: k.kept(tokens) if isinstance(k, Attention) else tokens, kinds.attention)


def kv_cache_bytes_transformers(
    spec: ModelSpec, tokens: int, batch: int = 1, bytes_per_element: float = 2
) -> tuple[int, ...]:
    """Per-layer bytes of transformers' DynamicCache for ``batch`` sequences of ``tokens`` tokens; a
    compressed layer (DeepSeek-V4) its cache's rule of the length (spec/compressed.py) in the activation
    dtype (``bytes_per_element``)."""
    per_token = kv_bytes_per_token_per_layer(spec, bytes_per_element)
    kept = tokens_kept_transformers(spec, tokens)
    out = [batch * p * t for p, t in zip(per_token, kept, strict=True)]
    for kind in model_kinds(spec).of(CompressedAttention):
        for i in kind.layers:
            out[i] = batch * kind.cache_bytes(tokens, round(bytes_per_element))  # type: ignore[union-attr]
    return tuple(out)


def has_compressed_cache(spec: ModelSpec) -> bool:
    """Whether some layers' cache is a rule of the length rather than a per-token figure (DeepSeek-V4)."""
    return bool(model_kinds(spec).of(CompressedAttention))
