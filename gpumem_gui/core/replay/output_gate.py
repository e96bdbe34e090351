"""The gated attention output of Qwen3-Next / Qwen3.5 (``Qwen3NextAttention.forward``, transformers 5.24):
``q_proj`` yields ``2 x heads x head_dim`` channels, ``torch.chunk`` splits them into the queries and a gate
(views), ``gate.reshape(b, s, -1)`` copies the strided gate, and the attention output is multiplied by
``torch.sigmoid(gate)`` before ``o_proj``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def split_q(m: CausalLM, x: T, pre: str) -> tuple[T, T | None]:
    """The queries (a view of q_proj's output) and, where the model gates its output, the copied gate."""
    proj = m.linear(x, f"{pre}.q_proj")
    if not m.spec.attn_output_gate:
        return m.o.view(proj, copy_grad=True), None
    half = proj.n // 2
    gate = m.s.new(half, proj.dt)  # gate.reshape(...) of the strided chunk: a copy
    m.s.node("copy", (proj,), (gate,))
    q = T(proj.st, half, proj.dt)
    m.s.node("copy", (proj,), (q,))  # the chunk's backward: a zero-filled full-size gradient
    return q, gate


def apply(m: CausalLM, out: T, gate: T | None) -> T:
    """``attn_output * torch.sigmoid(gate)`` (the output is already contiguous in [b, s, heads x d])."""
    if gate is None:
        return out
    sg = m.s.new(gate.n, gate.dt)
    m.s.node("copy", (gate,), (sg,), (sg,))
    return m.o.mul(out, sg)
