"""The gated DeltaNet token mixer (``Qwen3NextGatedDeltaNet.forward``, transformers 5.24) on symbolic tensors,
and the fixed per-sequence state its cache layers keep (``cache_utils.py`` ``LinearAttentionLayer``).

Forward: ``in_proj_qkvz`` / ``in_proj_ba``, the head reordering (reshapes that copy where the grouped layout
cannot be viewed), q/k/v concatenated into ``mixed_qkv``, the depthwise causal conv (``causal_conv1d_fn``: the
whole prompt, padded by ``kernel - 1``; ``causal_conv1d_update``: one token against the cached conv state),
beta and the fp32 decay ``g``, the gated delta rule (:mod:`.delta_rule`, transformers' torch fallback), the
gated RMSNorm (``Qwen3NextRMSNormGated``: fp32 norm, SiLU of the fp32 gate) and ``out_proj``.

State: the first forward allocates a conv state ``(b, conv_dim, kernel)`` in the activation dtype and an fp32
recurrent state ``(b, hv, dk, dv)`` per linear-attention layer and copies into them; later forwards update
them in place (:class:`RecurrentStates`). They are tagged ``recurrent_state`` apart from the KV cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import causal_conv, delta_rule
from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T
from gpumem_gui.core.replay.registry import MIXERS, register
from gpumem_gui.core.spec.linear import STATE_LAYER_TYPES
from gpumem_gui.core.spec.state import layer_state_elems

if TYPE_CHECKING:
    from gpumem_gui.core.replay.autograd import Sim
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.model import ModelSpec

TAG = "recurrent_state"


class RecurrentStates:
    """The conv and recurrent states of a forward: tensors of their own for the replayed linear-attention
    layers, one aggregate for the rest; allocated before the forward when ``past`` tokens are cached."""

    def __init__(self, sim: Sim, spec: ModelSpec, batch: int, past: int, dt: str, replayed: frozenset[int]):
        self.sim, self.batch, self.dt = sim, batch, dt
        la = spec.linear_attention  # the recurrent state's dtype: fp32, or the activations' (lightning)
        self.rec_dt = dt if la is not None and not la.recurrent_state_fp32 else "f32"
        self.linear = tuple(t in STATE_LAYER_TYPES for t in spec.resolved_layer_types)  # no KV cache
        # per layer: (conv, recurrent) state elements of one sequence (spec/state.py layer_state_elems)
        self.elems = tuple(layer_state_elems(spec, t) for t in spec.resolved_layer_types)
        # a state: the linear layers, and Falcon-H1's hybrid ones (KV and a Mamba-2 state in one layer)
        self.stateful = tuple(lin or any(e) for lin, e in zip(self.linear, self.elems, strict=True))
        self.layers: dict[int, tuple[T, T | None]] = {}
        self.cached = bool(past) if any(self.stateful) else False
        other = 0
        if self.cached:
            for i in range(spec.num_layers):
                if self.stateful[i] and i in replayed:
                    conv, rec = self.elems[i]
                    rec_t = self._new(batch * rec, self.rec_dt) if rec else None
                    self.layers[i] = (self._new(batch * conv, dt), rec_t)
                elif self.stateful[i]:
                    other += self._bytes(i)
        self.other: Storage = sim.storage(other, TAG)

    def _new(self, n: object, dt: str) -> T:
        return self.sim.new(n, dt, TAG)

    def _bytes(self, i: int) -> object:
        conv, rec = self.elems[i]
        return round(self.batch * conv * DT_BYTES[self.dt]) + round(self.batch * rec * DT_BYTES[self.rec_dt])

    def skip(self, first: int, stop: int) -> None:
        """Unreplayed layers ``first`` to ``stop - 1``: a first forward allocates their states."""
        if self.cached:
            return
        for i in range(first, stop):
            if self.stateful[i]:
                self.other.grow(self._bytes(i))

    def conv_state(self, i: int) -> T | None:
        st = self.layers.get(i)
        return st[0] if st is not None else None

    def recurrent_state(self, i: int) -> T | None:
        st = self.layers.get(i)
        return st[1] if st is not None else None

    def init_conv(self, i: int) -> None:
        """lazy_initialization: zeros (b, conv channels, kernel) in the conv input's dtype."""
        self.layers[i] = (self._new(self.batch * self.elems[i][0], self.dt), None)

    def new_state(self, i: int, n: object, dt: str) -> T:
        """MiniMaxCache.set_linear_cache: the layer's state becomes a new tensor (lightning attention's final
        KV, allocated here), the previous one dying with its last reference."""
        t = self._new(n, dt)
        self.layers[i] = (self._new(0, self.dt), t)
        return t

    def init_recurrent(self, i: int) -> None:
        """lazy_initialization: zeros_like(the fp32 final state)."""
        self.layers[i] = (self.layers[i][0], self._new(self.batch * self.elems[i][1], self.rec_dt))


def _reorder(m: CausalLM, qkvz: T, ba: T) -> tuple[T, T, T, T, T, T]:
    """fix_query_key_value_ordering and ``x.reshape(b, s, -1)``: views of the fused projections, except
    where the grouped layout cannot be viewed (value, z, b, a with several value heads per key head; the
    flattened query and key always; the flattened value with one value head per key head): copies."""
    la = m.spec.linear_attention
    assert la is not None
    t = m.cfg.tokens
    grouped = la.groups > 1

    def part(src: T, n: object, copy: bool) -> T:
        return new_op(m, n, src.dt, src) if copy else T(src.st, n, src.dt, src.rg, src.fn, src.idx)

    value = part(qkvz, t * la.value_dim, grouped)
    z = part(qkvz, t * la.value_dim, grouped)
    beta_in = part(ba, t * la.value_heads, grouped)
    a = part(ba, t * la.value_heads, grouped)
    query = part(qkvz, t * la.key_dim, True)
    key = part(qkvz, t * la.key_dim, True)
    value = part(value, value.n, not grouped)
    return query, key, value, z, beta_in, a


def _decay(m: CausalLM, i: int, a: T) -> T:
    """``g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)``: fp32 [b, s, hv]."""
    pre = f"layers.{i}.linear_attn"
    a_log = m.s.cast(m.param(f"{pre}.A_log"), "f32")
    neg = new_op(m, a_log.n, "f32", new_op(m, a_log.n, "f32", a_log, saved=(a_log,)))
    del a_log
    biased = new_op(m, a.n, "f32", m.s.cast(a, "f32"), m.param(f"{pre}.dt_bias"))
    sp = new_op(m, a.n, "f32", biased, saved=(biased,))
    del biased
    return new_op(m, a.n, "f32", neg, sp, saved=(neg, sp))


def _gated_norm(m: CausalLM, i: int, x: T, z: T) -> T:
    """Qwen3NextRMSNormGated over each value head: fp32 normalise, weight in the input dtype, times the fp32
    SiLU of the gate, cast back."""
    la, s = m.spec.linear_attention, m.s
    assert la is not None
    rows, dt = m.cfg.tokens * la.value_heads, x.dt
    hs = s.cast(x, "f32")
    var = new_op(m, rows, "f32", new_op(m, hs.n, "f32", hs, saved=(hs,)))
    inv = new_op(m, rows, "f32", new_op(m, rows, "f32", var), saved=())
    del var
    hs = new_op(m, hs.n, "f32", hs, inv, saved=(hs, inv))
    del inv
    hs = m.o.mul(m.param(f"layers.{i}.linear_attn.norm.weight"), s.cast(hs, dt), hs.n)
    gate32 = s.cast(z, "f32")
    gate = new_op(m, z.n, "f32", gate32, saved=(gate32,))  # silu(gate.to(float32))
    del gate32
    out = new_op(m, hs.n, "f32", hs, gate, saved=(hs, gate))
    del hs, gate
    return s.cast(out, dt)


@register(MIXERS, "gated_deltanet")
def gated_deltanet(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """Qwen3NextGatedDeltaNet.forward from the normed input; returns (output, None)."""
    s, la = m.s, m.spec.linear_attention
    assert la is not None
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.linear_attn"
    if la.split_projections:  # Qwen3_5GatedDeltaNet: mixed_qkv, z, b and a from their own projections
        held = [m.linear(x, f"{pre}.in_proj_qkv")]
        z = m.linear(x, f"{pre}.in_proj_z")
        beta_in = m.linear(x, f"{pre}.in_proj_b")
        a = m.linear(x, f"{pre}.in_proj_a")
        qkvz = ba = None
    else:
        qkvz = m.linear(x, f"{pre}.in_proj_qkvz")
        ba = m.linear(x, f"{pre}.in_proj_ba")
        query, key, value, z, beta_in, a = _reorder(m, qkvz, ba)
        held = [new_op(m, query.n + key.n + value.n, query.dt, query, key, value)]  # torch.cat
    # mixed_qkv is held only by the conv call's argument: rebound (padded, concatenated) or dropped there
    conv_out = causal_conv.conv(m, i, held.pop())
    t = m.cfg.tokens
    c = conv_out
    query = T(c.st, t * la.key_dim, c.dt, c.rg, c.fn, c.idx)  # torch.split: views
    key = T(c.st, t * la.key_dim, c.dt, c.rg, c.fn, c.idx)
    value = T(c.st, t * la.value_dim, c.dt, c.rg, c.fn, c.idx)
    beta = new_op(m, beta_in.n, beta_in.dt, beta_in, keep_out=True)  # b.sigmoid()
    g = _decay(m, i, a)
    st = m.cache.state if m.cache is not None else None
    init = st.recurrent_state(i) if st is not None else None
    if init is not None and m.cfg.q == 1:
        core, last = delta_rule.recurrent_rule(m, la, (query, key, value), g, beta, init)
    else:
        core, last = delta_rule.chunk_rule(m, la, (query, key, value), g, beta, init)
    if st is not None and init is None:
        st.init_recurrent(i)  # update_recurrent_state copies into it
    if la.groups == 1 and not la.split_projections:  # z.reshape(-1, dv) of a strided view copies
        z = new_op(m, z.n, z.dt, z)
    core = _gated_norm(m, i, core, z)
    out = m.linear(core, f"{pre}.out_proj")
    del core, last, qkvz, ba, z, query, key, value, conv_out, c
    s.region = prev
    return out, None
