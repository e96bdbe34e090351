"""One decoder layer: LlamaDecoderLayer.forward with the architecture's norm placement and parallel blocks,
or Falcon's and BLOOM's own blocks (:mod:`.legacy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, legacy, mlp
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.model import CausalLM


def decoder_layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None, *_: object
) -> tuple[T, T | None]:
    """LlamaDecoderLayer.forward, with the norm placement of the architecture (pre, post, sandwich) and
    parallel attention + MLP (GPT-NeoX); Falcon's and BLOOM's own blocks (:mod:`.legacy`). Returns the
    output and the attention weights (eager)."""
    o, s, spec = m.o, m.s, m.spec
    if spec.traits.block == "falcon":
        return legacy.falcon_layer(m, i, hidden_states, cos, sin, mask)
    if spec.traits.block == "bloom":
        return legacy.bloom_layer(m, i, hidden_states, m.alibi_bias, mask)
    placement = spec.traits.norm_placement
    residual = hidden_states
    s.tr.where = f"layer {i} attention"
    if placement != "post":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm0")
    if spec.parallel_attn_mlp:
        # GPTNeoXLayer / FalconDecoderLayer: the MLP reads the residual input through its own norm when
        # the layer has one (post_attention_layernorm, ln_mlp), else the attention's normed input
        attn, _weights = attention.attention(m, i, hidden_states, cos, sin, mask)
        s.tr.where = f"layer {i} MLP"
        if spec.norms_per_layer > 1:
            del hidden_states
            hidden_states = m.region_norm(residual, f"layers.{i}.norm1")
        mlp_out = mlp.mlp(m, i, hidden_states)
        del hidden_states
        s.region = "hidden_states"
        return o.add(o.add(residual, attn), mlp_out), _weights
    hidden_states, _weights = attention.attention(m, i, hidden_states, cos, sin, mask)
    n = 1 if placement == "sandwich" else 0
    if placement != "pre":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n}")
    s.region = "hidden_states"
    _attn_output = hidden_states if spec.traits.attn_output_kept else None  # held to the layer's end
    hidden_states = o.add(residual, hidden_states)
    residual = hidden_states
    s.tr.where = f"layer {i} MLP"
    if placement != "post":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n + 1}")
    hidden_states = mlp.mlp(m, i, hidden_states)
    if placement != "pre":
        hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm{n + 2 if n else 1}")
    s.region = "hidden_states"
    return o.add(residual, hidden_states), _weights
