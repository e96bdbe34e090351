"""Activations beyond SiLU and the GELUs, op by op as transformers 5.24 runs them (``activations.py``):

* ``relu2`` (``ReLUSquaredActivation``: ``torch.square(F.relu(x))``; Arcee AFM, Nemotron): relu's output is a
  new tensor that relu's backward and square's backward both keep.
* ``xielu`` (``XIELUActivation._xielu_python``, the path every CPU run and any GPU without the optional
  ``xielu`` CUDA wheel take; Apertus): ``torch.where(x > 0, alpha_p * x * x + beta * x,
  (expm1(min(x, eps)) - x) * alpha_n + beta * x)``. ``alpha_p`` / ``alpha_n`` are [1]-shaped parameters of
  the model's dtype, so with an fp32 model under autocast their products with a 16-bit ``x`` are fp32;
  ``beta`` and ``eps`` are 0-dim buffers, which do not promote.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``, the
activation's input ``x`` and the MLP's parameter prefix (``layers.3.mlp``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def relu2(m: CausalLM, x: T, pre: str) -> T:
    """``square(relu(x))``: relu saves its result (threshold_backward), square (pow 2) saves its input."""
    s = m.s
    r = s.new(x.n, x.dt)
    s.node("copy", (x,), (r,), (r,))
    return m.o.pow2(r)


def _softplus(m: CausalLM, p: T) -> T:
    """F.softplus of a [1] parameter: a new one-element tensor; its backward keeps the input."""
    s = m.s
    out = s.new(p.n, p.dt)
    s.node("copy", (p,), (out,), (p,))
    return out


def _minimum(m: CausalLM, x: T) -> T:
    """``torch.min(x, eps)`` with a 0-dim ``eps``: an elementwise minimum in x's dtype (saves its inputs)."""
    out = m.s.new(x.n, x.dt)
    m.s.node("mul", (x,), (out,), (x,))
    return out


def _expm1(m: CausalLM, x: T) -> T:
    """``torch.expm1``: a new tensor; its backward keeps the result."""
    out = m.s.new(x.n, x.dt)
    m.s.node("copy", (x,), (out,), (out,))
    return out


def xielu(m: CausalLM, x: T, pre: str) -> T:
    """``XIELUActivation._xielu_python`` (see the module docstring), in Python's evaluation order: the
    condition, the positive branch, then the negative branch, then ``torch.where``."""
    o, s = m.o, m.s
    alpha_p = _softplus(m, m.param(f"{pre}.act_fn.alpha_p"))
    alpha_n = o.add(_softplus(m, m.param(f"{pre}.act_fn.alpha_n")), None)  # beta (0-dim) + softplus
    cond = s.new(x.n, "bool")  # x > 0
    s.node("copy", (x,), (cond,))
    positive = o.add(o.mul(o.mul(alpha_p, x, x.n), x), o.mul(x, None))
    negative = o.add(o.mul(o.add(_expm1(m, _minimum(m, x)), x), alpha_n, x.n), o.mul(x, None))
    out = s.new(x.n, positive.dt if positive.dt == negative.dt else "f32")
    s.node("pass", (positive, negative), (out,), (cond,))  # where saves the condition
    del cond, positive, negative, alpha_p, alpha_n
    return out


ACTIVATIONS: dict[str, Callable[[CausalLM, T, str], T]] = {"relu2": relu2, "xielu": xielu}
# activations with parameters of their own: a compiled layer does not fuse them with the gate (replay/ffn.py
# gated); they stay op by op
PARAMETERISED = frozenset({"xielu"})
