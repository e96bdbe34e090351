"""The feed-forward building blocks the MLP and the MoE variants share: the activation, a dense (gated or
plain) MLP, the experts' grouped matmul and the shared expert. Below :mod:`.mlp` (which dispatches a layer's
feed-forward) and the MoE variants it dispatches to (:mod:`.chunked`, :mod:`.moe_bias`), so that none of
them imports its dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import activations, tricks
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def act(m: CausalLM, x: T, pre: str = "") -> T:
    """The activation: SiLU, NewGELU (GPT-2: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))), the
    ones in :mod:`.activations` (``pre``: the MLP's parameter prefix), or a fused GELU kernel."""
    name = m.spec.activation
    o = m.o
    if name in ("silu", "swish"):
        return o.silu(x)
    if name in activations.ACTIVATIONS:
        return activations.ACTIVATIONS[name](m, x, pre)
    if name == "gelu_new":
        half = o.mul(x, None)
        inner = o.mul(o.add(x, o.mul(o.pow3(x), None)), None)
        th = o.tanh(inner)
        del inner
        one_plus = o.add(th, None)
        del th
        return o.mul(half, one_plus)
    return o.gelu_tanh(x)


def _fuses(m: CausalLM) -> bool:
    """A compiled decoder layer (``torch.compile``) fuses the gated activation into one kernel that keeps
    gate and up for backward, the activation's output recomputed there (:func:`.tricks.fused_pointwise`);
    an activation with parameters of its own (:data:`.activations.PARAMETERISED`) stays op by op."""
    return m.cfg.compile and m.s.grad_enabled and m.spec.activation not in activations.PARAMETERISED


def gated(m: CausalLM, gate: T, up: T) -> T:
    """``act_fn(gate) * up`` of two views (or tensors the caller holds)."""
    if _fuses(m):
        return tricks.fused_pointwise(m.s, (gate, up), (gate, up))
    return m.o.mul(act(m, gate), up)


def gated_proj(m: CausalLM, x: T, pre: str) -> T:
    """``act_fn(gate_proj(x)) * up_proj(x)``; eager, the gate projection dies (inference) or is kept by the
    activation before the up projection runs, as Python evaluates the expression."""
    if _fuses(m):
        gate = m.linear(x, f"{pre}.gate_proj")
        return gated(m, gate, m.linear(x, f"{pre}.up_proj"))
    return m.o.mul(act(m, m.linear(x, f"{pre}.gate_proj")), m.linear(x, f"{pre}.up_proj"))


def clamp(m: CausalLM, x: T) -> T:
    """``x.clamp(...)`` by python numbers: a new tensor; ClampBackward saves the input for its mask."""
    out = m.s.new(x.n, x.dt)
    m.s.node("copy", (x,), (out,), (x,))
    return out


def dense(m: CausalLM, pre: str, x: T) -> T:
    o, spec = m.o, m.spec
    if not spec.mlp_gated:
        h = act(m, m.linear(x, f"{pre}.up_proj"), pre)
        out = m.linear(h, f"{pre}.down_proj")
        del h
        return o.dropout(out, m.cfg.dropout) if spec.traits.residual_dropout else out
    if spec.traits.fused_gate_up and m.has(f"{pre}.gate_up_proj.weight"):
        up_states = m.linear(x, f"{pre}.gate_up_proj")
        n = up_states.n // 2
        gate, up = T(up_states.st, n, up_states.dt), T(up_states.st, n, up_states.dt)
        m.s.node("split", (up_states,), (gate, up))
        del up_states
        up = gated(m, gate, up)  # Phi3MLP: up_states * activation_fn(gate)
        out = m.linear(up, f"{pre}.down_proj")
        del up
        return out
    prod = gated_proj(m, x, pre)
    if not spec.traits.residual_dropout:
        return m.linear(prod, f"{pre}.down_proj")
    out = m.linear(prod, f"{pre}.down_proj")  # SeedOssMLP: dropout(residual_dropout) on the output
    del prod
    return o.dropout(out, m.cfg.dropout)


def grouped(m: CausalLM, x: T, w: T, n_out: int) -> T:
    """_grouped_mm(input.to(weight.dtype), weight, offs): saves the input and the (3-D) weight; backward
    gives the input's gradient and one for the whole expert tensor."""
    s = m.s
    x = s.cast(x, w.dt)
    out = s.new(n_out, w.dt)
    saved = []
    if x.fn is not None:
        saved.append(w)
    if w.fn is not None:
        saved.append(x)
    s.node("linear", (x, w), (out,), tuple(saved))
    return out


def shared(m: CausalLM, pre: str, x: T) -> T:
    """The shared expert: a gated MLP of ``shared_expert_intermediate_size`` on every token."""
    sh = f"{pre}.shared_experts"
    if m.has(f"{sh}.gate_up_proj.weight"):  # GraniteMoeHybridMLP: one input_linear chunked (fused_gate_up)
        return dense(m, sh, x)
    prod = gated_proj(m, x, sh)
    return m.linear(prod, f"{sh}.down_proj")
