"""Recurrent state: the fixed memory one sequence keeps in each linear-attention layer, whatever its length.

transformers 5.24 (``cache_utils.py`` ``LinearAttentionLayer.lazy_initialization``) allocates per sequence and
linear-attention layer:

* a conv state ``zeros((batch, conv_dim, conv_kernel))`` in the dtype of the conv's input (the activations:
  ``mixed_qkv`` of ``Qwen3NextGatedDeltaNet.forward``);
* a recurrent state ``zeros_like(last_recurrent_state)``: ``(batch, num_v_heads, k_head_dim, v_head_dim)`` in
  the dtype the gated delta rule returns it, fp32 (``torch_chunk_gated_delta_rule`` computes in fp32; fla's
  ``chunk_gated_delta_rule`` also returns an fp32 final state).

Attention layers keep per-token keys and values instead (:mod:`gpumem_gui.core.spec.kv`); the two together
describe a hybrid model's cache: :func:`memory_by_layer_type`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.spec.kinds import RECURRENT_STATE_BYTES
from gpumem_gui.core.spec.kinds_of import model_kinds, state_shape
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.model import ModelSpec


def has_state(spec: ModelSpec) -> bool:
    """Whether some layer keeps a fixed state per sequence (gated DeltaNet, LFM2's short convolutions)."""
    return spec.linear_attention is not None or spec.short_conv is not None or spec.mamba is not None


def layer_state_elems(spec: ModelSpec, layer_type: str) -> tuple[int, int]:
    """(conv state, recurrent state) elements one sequence keeps in a layer of ``layer_type``: the gated
    DeltaNet's ``(conv_dim, kernel)`` and ``(hv, dk, dv)``; a short conv's ``(hidden, kernel)`` only
    (Lfm2ShortConv: cache.update_conv_state, no recurrent state); none for attention."""
    shape = state_shape(spec, layer_type)  # the state kinds' own (spec/kinds.py)
    return (shape[1], shape[2]) if shape is not None else (0, 0)


def recurrent_state_bytes(spec: ModelSpec, activation_bytes: float = 2) -> float:
    """Bytes of one recurrent-state element: fp32, except lightning attention's (MiniMaxLightningAttention:
    ``torch.zeros(..., dtype=value_states.dtype)``, the activation dtype)."""
    la = spec.linear_attention
    return activation_bytes if la is not None and not la.recurrent_state_fp32 else RECURRENT_STATE_BYTES


def state_bytes_per_sequence_per_layer(spec: ModelSpec, activation_bytes: float = 2) -> tuple[int, ...]:
    """Bytes of fixed state one sequence holds in each layer (0 for attention layers): the conv state in
    the activation dtype (``activation_bytes``) plus the recurrent state (the state kinds of
    spec/kinds.py)."""
    kinds = model_kinds(spec)
    return kinds.per_layer(lambda k: k.state_bytes(activation_bytes), kinds.state)


def state_bytes_per_sequence(spec: ModelSpec, activation_bytes: float = 2) -> int:
    """Fixed state bytes of one sequence over all layers (0 for a model without linear-attention layers)."""
    return sum(state_bytes_per_sequence_per_layer(spec, activation_bytes))


def state_parts_per_sequence(spec: ModelSpec, activation_bytes: float = 2) -> tuple[int, int]:
    """(conv state bytes, recurrent state bytes) of one sequence in one stateful layer (a gated DeltaNet's,
    else a short conv's)."""
    lt = "linear_attention" if spec.linear_attention is not None else "mamba" if spec.mamba else "conv"
    conv, rec = layer_state_elems(spec, lt)
    return round(conv * activation_bytes), round(rec * recurrent_state_bytes(spec, activation_bytes))


@dataclass(frozen=True)
class LayerTypeMemory:
    """One layer type of a model: how many layers, what one token costs in their KV cache (all of them
    together) and what fixed state one sequence keeps in them (all of them together)."""

    layer_type: str
    layers: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int


def memory_by_layer_type(
    spec: ModelSpec, kv_bytes_per_element: float = 2, activation_bytes: float = 2
) -> tuple[LayerTypeMemory, ...]:
    """Per layer type (in order of first appearance): KV bytes per token and state bytes per sequence."""
    kv = kv_bytes_per_token_per_layer(spec, kv_bytes_per_element)
    st = state_bytes_per_sequence_per_layer(spec, activation_bytes)
    out: dict[str, list[int]] = {}
    for i, lt in enumerate(spec.resolved_layer_types):
        row = out.setdefault(lt, [0, 0, 0])
        row[0] += 1
        row[1] += kv[i]
        row[2] += st[i]
    return tuple(LayerTypeMemory(lt, n, k, s) for lt, (n, k, s) in out.items())


def hybrid_layer_kinds(spec: ModelSpec) -> tuple[int, tuple[int, ...], ModelSpec]:
    """The distinct layers of a hybrid model for the weight layout (formats/layout.py): one kind per (layer
    type, MoE or dense), each layer's kind, and a model with one layer of each kind."""
    keys = [(spec.resolved_layer_types[i], spec.is_moe_layer(i)) for i in range(spec.num_layers)]
    order = list(dict.fromkeys(keys))
    moe = spec.moe
    if moe is not None:
        moe = moe.model_copy(
            update={"dense_layers": tuple(j for j, (_, sparse) in enumerate(order) if not sparse)}
        )
    mini = spec.model_copy(
        update={"num_layers": len(order), "layer_types": tuple(t for t, _ in order), "moe": moe}
    )
    return len(order), tuple(order.index(k) for k in keys), mini


def state_facts(spec: ModelSpec, batch: int, activation_bytes: float, kv_bytes: float) -> dict[str, int]:
    """An inference estimate's facts about the fixed state (none for a model without linear-attention
    layers): the bytes ``batch`` sequences keep, per sequence, and the KV bytes per token beside it."""
    if not has_state(spec):
        return {}
    per = state_bytes_per_sequence(spec, activation_bytes)
    return {
        "state_bytes": batch * per,
        "state_bytes_per_sequence": per,
        "kv_cache_bytes_per_token": sum(kv_bytes_per_token_per_layer(spec, kv_bytes)),
    }


def describe_linear_attention(spec: ModelSpec) -> str | None:
    """One line on a model's linear-attention layers for the CLI and the window (None without them)."""
    la, per = spec.linear_attention, state_bytes_per_sequence(spec)
    if spec.mamba is not None and spec.mamba.kind == "mamba1":
        mb1, n = spec.mamba, len(model_kinds(spec).layers_of("mamba1"))
        return (
            f"Mamba on {n} of {spec.num_layers} layers: {mb1.inner} channels, state {mb1.state_size}, conv "
            f"{mb1.conv_kernel}; fixed state {per / (1 << 20):.1f} MiB per sequence (bf16)"
        )
    if spec.mamba is not None:  # hybrid: beside attention in the same layer (FalconH1DecoderLayer)
        mb, n = spec.mamba, len(model_kinds(spec).layers_of(spec.mamba.kind))
        return (
            f"Mamba-2 on {n} of {spec.num_layers} layers: {mb.heads} heads of {mb.head_dim}, state "
            f"{mb.state_size}, conv {mb.conv_kernel}; fixed state {per / (1 << 20):.1f} MiB per sequence "
            "(bf16)"
        )
    if spec.short_conv is not None:
        n = len(model_kinds(spec).layers_of("short_conv"))
        return (
            f"short convolutions (kernel {spec.short_conv.kernel}) on {n} of {spec.num_layers} layers; fixed "
            f"state {per / (1 << 20):.2f} MiB per sequence (bf16)"
        )
    if la is None:
        return None
    n = len(model_kinds(spec).layers_of(la.kind))
    if la.kind == "lightning":
        return (
            f"lightning attention on {n} of {spec.num_layers} layers: {la.key_heads} heads of "
            f"{la.key_head_dim}, blocks of {la.chunk_size}; fixed state {per / (1 << 20):.1f} MiB per "
            "sequence (bf16)"
        )
    if la.kind == "kda":  # KimiLinearDeltaAttention / BailingHybridDeltaAttention
        return (
            f"Kimi Delta Attention on {n} of {spec.num_layers} layers: {la.key_heads} heads of "
            f"{la.key_head_dim}, conv {la.conv_kernel}; fixed state {per / (1 << 20):.1f} MiB per sequence "
            "(bf16)"
        )
    dims = (
        f"{la.key_head_dim}"
        if la.key_head_dim == la.value_head_dim
        else f"{la.key_head_dim}/{la.value_head_dim}"
    )
    return (
        f"gated DeltaNet on {n} of {spec.num_layers} layers: {la.key_heads} QK / {la.value_heads} V heads of "
        f"{dims}, conv {la.conv_kernel}; fixed state {per / (1 << 20):.1f} MiB per sequence (bf16)"
    )
