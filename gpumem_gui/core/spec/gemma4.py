"""Gemma 4's decoder (``models/gemma4/modeling_gemma4.py``, transformers 5.24) as data (:class:`Gemma4Spec`)
and the parameter tensors it builds (:func:`gemma4_tensors`).

What differs from Gemma 3 (Gemma4TextAttention, Gemma4TextDecoderLayer, Gemma4TextModel):

* the full-attention layers have their own head dim and KV-head count (``global_head_dim``,
  ``num_global_key_value_heads``: Gemma4TextConfig.__post_init__'s ``per_layer_config``), so their cache and
  projections differ from the sliding layers';
* ``attention_k_eq_v``: a full layer has no ``v_proj``, its values are the k projection (normed apart);
* KV sharing as Gemma 3n (the last ``num_kv_shared_layers`` layers have no k/v weights and no cache), and
  ``use_double_wide_mlp``: those layers' MLPs are twice as wide (Gemma4TextMLP);
* per-layer embeddings (PLE) without AltUp or Laurel: the packed table, its projection and norm, and per layer
  a gate, a projection and a norm;
* the MoE block runs beside the dense MLP (Gemma4TextRouter: a weightless norm, ``scale`` and
  ``per_expert_scale`` vectors, ``proj``; Gemma4TextExperts: fused gate_up / down; three more norms).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.base import Frozen, NonNegInt, PositiveInt

if TYPE_CHECKING:  # params.Tensor is passed in to keep spec.params -> spec.gemma4 one-way at import
    from gpumem_gui.core.spec.model import ModelSpec
    from gpumem_gui.core.spec.params import Tensor


class Gemma4Spec(Frozen):
    """What Gemma4TextConfig adds to a Gemma-3-like decoder (the MoE block's sizes: ``ModelSpec.moe``)."""

    global_head_dim: PositiveInt = Field(
        description="head dim of the full-attention layers (global_head_dim)"
    )
    global_kv_heads: PositiveInt = Field(
        description="KV heads of the full-attention layers (num_global_key_value_heads with "
        "attention_k_eq_v, else num_key_value_heads: Gemma4TextConfig.__post_init__)"
    )
    k_eq_v: bool = Field(
        False, description="full layers have no v_proj; values are the k projection (attention_k_eq_v)"
    )
    per_layer_input_size: NonNegInt = Field(
        0, description="hidden_size_per_layer_input: each layer's slice of the PLE table (0: no PLE)"
    )
    per_layer_vocab_size: PositiveInt = Field(
        1, description="rows of the PLE table (vocab_size_per_layer_input)"
    )
    double_wide_mlp: bool = Field(
        False, description="KV-shared layers' MLPs are twice intermediate_size wide (use_double_wide_mlp)"
    )


def _is_full(spec: ModelSpec, i: int) -> bool:
    return spec.resolved_layer_types[i] == "full_attention"


def head_dim(spec: ModelSpec, i: int) -> int:
    """Gemma4TextAttention.head_dim: ``per_layer_config[i].head_dim``."""
    g = spec.gemma4
    assert g is not None
    return g.global_head_dim if _is_full(spec, i) else spec.head_dim


def kv_heads(spec: ModelSpec, i: int) -> int:
    g = spec.gemma4
    assert g is not None
    return g.global_kv_heads if _is_full(spec, i) else spec.num_kv_heads


def has_v_proj(spec: ModelSpec, i: int) -> bool:
    """Gemma4TextAttention.use_alternative_attention: ``attention_k_eq_v and not is_sliding``."""
    g = spec.gemma4
    assert g is not None
    return not (g.k_eq_v and _is_full(spec, i))


def mlp_width(spec: ModelSpec, i: int) -> int:
    g = spec.gemma4
    assert g is not None
    wide = g.double_wide_mlp and i in spec.kv_shared_layers
    return spec.intermediate_size * (2 if wide else 1)


def kv_elems(spec: ModelSpec, i: int) -> tuple[int, int]:
    """(K, V) elements one token adds to layer ``i``'s cache (0 on a KV-shared layer): values are stored
    apart even when they come from the k projection (cache.update gets both)."""
    if i in spec.kv_shared_layers:
        return 0, 0
    w = kv_heads(spec, i) * head_dim(spec, i)
    return w, w


def gemma4_tensors(spec: ModelSpec, tensor: type[Tensor]) -> Iterator[Tensor]:
    """Every parameter of Gemma4TextModel (+ an untied lm_head), tied weights once; the norms of
    Gemma4TextDecoderLayer as ``norm0..3`` (input, post_attention, pre_feedforward, post_feedforward)."""
    g, h, n = spec.gemma4, spec.hidden_size, spec.num_layers
    assert g is not None
    p = g.per_layer_input_size
    yield tensor("embed_tokens.weight", (spec.vocab_size, h), "embedding")
    for i in range(n):
        yield from _layer(spec, i, tensor)
    yield tensor("norm.weight", (h,), "norms")
    if p:
        yield tensor("embed_tokens_per_layer.weight", (g.per_layer_vocab_size, n * p), "embedding_extra")
        yield tensor("per_layer_model_projection.weight", (n * p, h), "embedding_extra")
        yield tensor("per_layer_projection_norm.weight", (p,), "norms")
    if not spec.tie_word_embeddings:
        yield tensor("lm_head.weight", (spec.vocab_size, h), "lm_head")


def _layer(spec: ModelSpec, i: int, tensor: type[Tensor]) -> Iterator[Tensor]:
    g, h, a = spec.gemma4, spec.hidden_size, spec.num_attention_heads
    assert g is not None
    d, kv, pre = head_dim(spec, i), kv_heads(spec, i) * head_dim(spec, i), f"layers.{i}"
    for k in range(4):
        yield tensor(f"{pre}.norm{k}.weight", (h,), "norms", i)
    at = f"{pre}.self_attn"
    yield tensor(f"{at}.q_proj.weight", (a * d, h), "attention", i)
    yield tensor(f"{at}.q_norm.weight", (d,), "norms", i)
    if i not in spec.kv_shared_layers:  # Gemma4TextAttention: no k/v weights on a KV-shared layer
        yield tensor(f"{at}.k_norm.weight", (d,), "norms", i)
        yield tensor(f"{at}.k_proj.weight", (kv, h), "attention", i)
        if has_v_proj(spec, i):
            yield tensor(f"{at}.v_proj.weight", (kv, h), "attention", i)
    yield tensor(f"{at}.o_proj.weight", (h, a * d), "attention", i)
    f = mlp_width(spec, i)
    yield tensor(f"{pre}.mlp.gate_proj.weight", (f, h), "mlp", i)
    yield tensor(f"{pre}.mlp.up_proj.weight", (f, h), "mlp", i)
    yield tensor(f"{pre}.mlp.down_proj.weight", (h, f), "mlp", i)
    if g.per_layer_input_size:
        pl = g.per_layer_input_size
        yield tensor(f"{pre}.per_layer_input_gate.weight", (pl, h), "mlp", i)
        yield tensor(f"{pre}.per_layer_projection.weight", (h, pl), "mlp", i)
        yield tensor(f"{pre}.post_per_layer_input_norm.weight", (h,), "norms", i)
    moe = spec.moe
    if moe is not None:  # Gemma4TextRouter, Gemma4TextExperts and the block's three extra norms
        e, fe = moe.num_experts, moe.expert_intermediate_size
        yield tensor(f"{pre}.router.proj.weight", (e, h), "router", i)
        yield tensor(f"{pre}.router.scale", (h,), "router", i)
        yield tensor(f"{pre}.router.per_expert_scale", (e,), "router", i)
        yield tensor(f"{pre}.experts.gate_up_proj", (e, 2 * fe, h), "routed_experts", i)
        yield tensor(f"{pre}.experts.down_proj", (e, h, fe), "routed_experts", i)
        for name in (
            "post_feedforward_layernorm_1",
            "post_feedforward_layernorm_2",
            "pre_feedforward_layernorm_2",
        ):
            yield tensor(f"{pre}.{name}.weight", (h,), "norms", i)


def rotary_buffer_bytes(spec: ModelSpec) -> int:
    """Gemma4TextRotaryEmbedding: ``{type}_inv_freq`` and ``{type}_original_inv_freq`` (fp32, head_dim / 2:
    the proportional RoPE of the full layers returns head_dim / 2 frequencies too) per layer type."""
    types = set(spec.resolved_layer_types)
    return sum(2 * (head_dim(spec, spec.resolved_layer_types.index(t)) // 2) * 4 for t in types)


def check_run(
    spec: ModelSpec, engine: str = "transformers", *, heads_ok: bool = True, **degrees: int
) -> None:
    """What is modelled for Gemma 4: transformers on one GPU. The engines' KV pools and a sharded or staged
    model (rank_spec does not split the full layers' heads nor renumber the KV-shared layers) are refused in
    one line naming the field; ``heads_ok``: whether ``engine`` models attention layers of several head
    shapes."""
    if spec.gemma4 is None:
        return
    if not heads_ok:  # the engine's capability (Runtime.mixed_head_shapes)
        raise GpumemInputError(
            f"{engine}: Gemma 4's per-layer-type KV heads and KV sharing are not modelled for this engine; "
            "use the transformers engine",
            field="engine",
        )
    for field, n in degrees.items():
        if n > 1:
            raise GpumemInputError(f"{field} {n}: Gemma 4 is modelled on one GPU; use {field} 1", field=field)
