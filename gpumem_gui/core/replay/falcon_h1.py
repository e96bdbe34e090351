"""Falcon-H1's decoder layer on symbolic tensors (``models/falcon_h1/modeling_falcon_h1.py``
``FalconH1DecoderLayer.forward``, transformers 5.24): one norm, then the Mamba-2 mixer and the attention side
by side on the same normed input, each scaled by its muP multiplier, summed into the residual; then the MLP
(``FalconH1MLP``) with its gate and down multipliers. Every multiplier is a Python float, so each product is a
new tensor that autograd does not save. The mixer is :func:`.mamba2.mamba2` (with the spec's ``mup``: the
input times ``ssm_in_multiplier``, ``in_proj``'s output times the ``mup_vector`` buffer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, mamba2, mlp
from gpumem_gui.core.replay.registry import BLOCKS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.replay.memory import T


def _mlp(m: CausalLM, i: int, x: T) -> T:
    """FalconH1MLP.forward: ``up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)``, then
    ``down_proj(y) * down_multiplier``."""
    o, s = m.o, m.s
    prev, s.region = s.region, "mlp"
    pre = f"layers.{i}.mlp"
    up = m.linear(x, f"{pre}.up_proj")
    gate = o.mul(m.linear(x, f"{pre}.gate_proj"), None)
    y = o.mul(up, mlp.act(m, gate, pre))
    del up, gate
    out = o.mul(m.linear(y, f"{pre}.down_proj"), None)
    del y
    s.region = prev
    return out


@register(BLOCKS, "parallel_mamba")
def layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None
) -> tuple[T, T | None]:
    """FalconH1DecoderLayer.forward: the residual, input_layernorm, ``mamba(h) * ssm_out_multiplier``,
    ``self_attn(h * attention_in_multiplier) * attention_out_multiplier``, their sum added to the residual;
    pre_ff_layernorm, the MLP, the residual add."""
    o, s = m.o, m.s
    residual = hidden_states
    s.tr.where = f"layer {i} hybrid"
    normed = m.region_norm(hidden_states, f"layers.{i}.norm0")
    ssm = o.mul(mamba2.mamba2(m, i, normed), None)
    scaled = o.mul(normed, None)
    attn, weights = attention.attention(m, i, scaled, cos, sin, mask)
    del scaled
    attn = o.mul(attn, None)
    del normed  # the layer's hidden_states name holds the normed input until the sum replaces it
    s.region = "hidden_states"
    mixed = o.add(ssm, attn)
    del ssm, attn
    hidden_states = o.add(residual, mixed)
    del mixed, residual
    residual = hidden_states
    s.tr.where = f"layer {i} MLP"
    out = _mlp(m, i, m.region_norm(hidden_states, f"layers.{i}.norm1"))
    s.region = "hidden_states"
    return o.add(residual, out), weights
