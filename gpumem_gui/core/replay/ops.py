"""torch ops over symbolic tensors: output sizes and dtypes, autocast casts, and what autograd saves.

Each method is one torch op as the modeling code calls it (``a * b``, ``F.linear``, ``torch.matmul``,
``nn.Dropout``): it allocates the op's output in the current region and records the autograd node with the
tensors ``tools/autograd/derivatives.yaml`` saves for it (nothing at all with gradients off).
"""

from __future__ import annotations

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.memory import T, promote


class Ops:
    """torch ops over symbolic tensors: output sizes/dtypes, autocast casts, what autograd saves."""

    def __init__(self, sim: Sim, cpu_dropout: bool = False) -> None:
        self.s = sim
        self.cpu_dropout = cpu_dropout

    # -- elementwise ---------------------------------------------------------------------------------------
    def mul(self, a: T, b: T | None, n: int | None = None) -> T:
        """a * b (b None: a python scalar). Saves each operand the other's gradient needs."""
        s = self.s
        if b is None:
            out = s.new(a.n, a.dt)
            s.node("copy", (a,), (out,))
            return out
        dt = _promote(a, b)
        out = s.new(n if n is not None else max(a.n, b.n), dt)
        saved = []
        if a.fn is not None:
            saved.append(b)
        if b.fn is not None:
            saved.append(a)
        s.node("mul", (a, b), (out,), tuple(saved))
        return out

    def add(self, a: T, b: T | None, n: int | None = None) -> T:
        s = self.s
        if b is None:
            out = s.new(a.n, a.dt)
            s.node("pass", (a,), (out,))
            return out
        out = s.new(n if n is not None else max(a.n, b.n), _promote(a, b))
        s.node("pass", (a, b), (out,))
        return out

    def neg(self, a: T) -> T:
        out = self.s.new(a.n, a.dt)
        self.s.node("copy", (a,), (out,))
        return out

    def cat(self, a: T, b: T) -> T:
        out = self.s.new(a.n + b.n, _promote(a, b))
        self.s.node("pass", (a, b), (out,))
        return out

    def slice_half(self, x: T) -> T:
        """``x[..., :d/2]``: a view; its backward is slice_backward (a zero-filled full-size gradient)."""
        out = T(x.st, x.n // 2, x.dt)
        self.s.node("copy", (x,), (out,))
        return out

    def view(self, x: T, copy_grad: bool = False) -> T:
        """A view (view/transpose/reshape of contiguous data). ``copy_grad``: its backward has to make the
        incoming gradient contiguous (``.view(...).transpose(1, 2)`` of q/k/v: ViewBackward clones)."""
        out = T(x.st, x.n, x.dt)
        self.s.node("copy" if copy_grad else "pass", (x,), (out,))
        return out

    def clone(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pass", (x,), (out,))
        return out

    def silu(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (x,))
        return out

    def gelu_tanh(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (x,))
        return out

    def tanh(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("copy", (x,), (out,), (out,))
        return out

    def pow2(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pow", (x,), (out,), (x,))
        return out

    def pow3(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("pow", (x,), (out,), (x,))
        return out

    def mean_last(self, x: T, width: int) -> T:
        out = self.s.new(x.n // width, x.dt)
        self.s.node("copy", (x,), (out,))
        return out

    def rsqrt(self, x: T) -> T:
        out = self.s.new(x.n, x.dt)
        self.s.node("rsqrt", (x,), (out,), (out,))
        return out

    def dropout(self, x: T, p: float) -> T:
        """nn.Dropout in training: ``p == 0`` returns the input; otherwise CUDA's native_dropout returns the
        output and a bool mask and saves the mask. (The CPU kernel, ``_dropout``, instead multiplies by a
        noise
        tensor of the input's dtype and saves that: ``cpu_dropout``, used to check against CPU
        measurements.)"""
        if p <= 0:
            return x
        out = self.s.new(x.n, x.dt)
        mask = self.s.new(x.n, x.dt if self.cpu_dropout else "bool")
        self.s.node("mul", (x,), (out,), (mask,))
        return out

    # -- matmuls -------------------------------------------------------------------------------------------
    def linear(self, x: T, w: T, b: T | None, n_out: int, n_in: int) -> T:
        """F.linear -> mm/addmm: saves the weight for grad_input and the input for grad_weight."""
        s = self.s
        x = s.ac_cast(x)  # type: ignore[assignment]
        w = s.ac_cast(w)  # type: ignore[assignment]
        b = s.ac_cast(b)
        rows = x.n // n_in
        out = s.new(rows * n_out, _promote(x, w))
        saved = []
        if x.fn is not None:
            saved.append(w)
        if w.fn is not None:
            saved.append(x)
        s.node("linear", (x, w, b), (out,), tuple(saved))
        return out

    def bmm(self, a: T, b: T, n_out: int) -> T:
        s = self.s
        a = s.ac_cast(a)  # type: ignore[assignment]
        b = s.ac_cast(b)  # type: ignore[assignment]
        out = s.new(n_out, _promote(a, b))
        saved = []
        if a.fn is not None:
            saved.append(b)
        if b.fn is not None:
            saved.append(a)
        s.node("linear", (a, b), (out,), tuple(saved))
        return out


def _promote(a: T, b: T) -> str:
    da, db = a.dt, b.dt
    return da if da == db else promote(da, db)
