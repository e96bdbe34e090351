"""Sizes as polynomials in a point's variables: :class:`Sym`, the number a tape records with.

A :class:`Sym` carries its polynomial in (``b``, ``q``, ``p``) (batch, new or trained tokens, cached tokens)
and its value at the point being recorded. Arithmetic keeps both; every comparison is answered from the value
and, while a tape records (:mod:`.tape`), kept as a *guard*: the polynomial of the difference and the sign it
had. A tape serves any point where every guard has the sign it had when it was recorded.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from fractions import Fraction
from math import lcm
from typing import Any

Mono = tuple[int, int, int]  # exponents of (b, q, p)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def guard_sign(guard: tuple[dict[Mono, float], str, bool], point: tuple[int, int, int]) -> int:
    value = sum(c * point[0] ** m[0] * point[1] ** m[1] * point[2] ** m[2] for m, c in guard[0].items())
    return (value > 0) - (value < 0)


class TapeUnsupported(Exception):
    """The replay did something a tape cannot express (a division that is not exact)."""


class _Recording(threading.local):
    """The guards and congruences of the tape this thread is recording (None: it records none), the point it
    records at, and whether a rounded size must be whole (a training step's tape)."""

    def __init__(self) -> None:
        self.guards: list[tuple[dict[Mono, float], str, bool]] | None = None
        # (polynomial, modulus, remainder) of every ``//`` and ``%`` that is not a polynomial division
        self.congruences: list[tuple[dict[Mono, float], int, int]] | None = None
        self.point: tuple[int, int, int] = (0, 0, 0)
        self.whole = False


# one per thread: the window's estimate (GUI thread) and its fit and sweep (a worker) record side by side
RECORDING = _Recording()


def poly(x: Sym | int | float) -> dict[Mono, float]:
    if type(x) is Sym:
        return x.c
    return {(0, 0, 0): x} if x else {}


class Sym:
    """A size as a polynomial in (b, q, p) with its value at the recorded point; comparisons become guards."""

    __slots__ = ("_times", "c", "v")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, c: dict[Mono, float], v: float) -> None:
        self.c = c
        self.v = v
        # the last product with a whole number, kept: a size is never changed in place, and a tensor's
        # elements are multiplied by its dtype's width again and again (its storage, each gradient the
        # backward engine makes for it and checks against it)
        self._times: tuple[int, Sym] | None = None

    @staticmethod
    def var(index: int, value: int) -> Sym:
        mono = tuple(1 if i == index else 0 for i in range(3))
        return Sym({mono: 1}, value)  # type: ignore[dict-item]

    def _add(self, other: Any, sign: int) -> Sym:
        if isinstance(other, Sym):
            c = dict(self.c)
            for k, v in other.c.items():
                c[k] = c.get(k, 0) + sign * v
            return Sym(c, self.v + sign * other.v)
        if other == 0:
            return self
        c = dict(self.c)
        c[(0, 0, 0)] = c.get((0, 0, 0), 0) + sign * other
        return Sym(c, self.v + sign * other)

    def __add__(self, other: Any) -> Sym:
        return self._add(other, 1)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Sym:
        return self._add(other, -1)

    def __rsub__(self, other: Any) -> Sym:
        return (-self)._add(other, 1)

    def __neg__(self) -> Sym:
        return Sym({k: -v for k, v in self.c.items()}, -self.v)

    def __mul__(self, other: Any) -> Sym:
        if type(other) is Sym:
            c: dict[Mono, float] = {}
            for k1, v1 in self.c.items():
                for k2, v2 in other.c.items():
                    k = (k1[0] + k2[0], k1[1] + k2[1], k1[2] + k2[2])
                    c[k] = c.get(k, 0) + v1 * v2
            return Sym(c, self.v * other.v)
        if type(other) is not int:
            return Sym({k: v * other for k, v in self.c.items()}, self.v * other)
        if other == 1:
            return self  # a size is never changed in place: times the int 1 it is itself
        times = self._times
        if times is not None and times[0] == other:
            return times[1]
        out = Sym({k: v * other for k, v in self.c.items()}, self.v * other)
        self._times = (other, out)
        return out

    __rmul__ = __mul__

    def __floordiv__(self, other: int | Sym) -> Sym:
        if isinstance(other, Sym) and set(other.c) == {(0, 0, 0)} and type(other.c[(0, 0, 0)]) is int:
            other = other.c[(0, 0, 0)]  # a size that came out constant (``b*q*V // (b*q)``)
        if isinstance(other, Sym):
            return self._by_monomial(other)
        if not isinstance(other, int) or other <= 0:
            raise TapeUnsupported(f"a size divided by {other!r}")
        if not any(v % other for v in self.c.values()):
            return Sym({k: v // other for k, v in self.c.items()}, self.v // other)
        # not a polynomial division: ``(x - r) / d`` where ``x`` leaves the remainder ``r`` it left here (a
        # congruence guard), with rational coefficients and a whole value at every point the guard admits
        r = self % other
        c = {k: Fraction(v) / other for k, v in self.c.items()}
        c[(0, 0, 0)] = c.get((0, 0, 0), 0) - Fraction(r, other)
        return Sym({k: v for k, v in c.items() if v}, (self.v - r) // other)

    def _by_monomial(self, other: Sym) -> Sym:
        """``self // other`` where ``other`` is one term that divides every term of ``self`` (the rows of a
        batch divided by the batch)."""
        ((mono, coef),) = other.c.items() if len(other.c) == 1 else ((None, 0),)
        out: dict[Mono, Any] = {}
        for k, v in self.c.items():
            if mono is None or any(e < f for e, f in zip(k, mono, strict=True)) or v % coef:
                raise TapeUnsupported("a size divided by a size that does not divide it")
            out[(k[0] - mono[0], k[1] - mono[1], k[2] - mono[2])] = v // coef
        return Sym(out, self.v // other.v)

    def __mod__(self, other: int) -> int:
        """The remainder here, kept as a congruence guard (the tape serves the points that leave it)."""
        if isinstance(other, Sym) or not isinstance(other, int) or other <= 0 or self.v != int(self.v):
            raise TapeUnsupported(f"a size modulo {other!r} (or rounded) that is not whole")
        r = int(self.v) % other
        if RECORDING.congruences is not None:
            RECORDING.congruences.append((dict(self.c), other, r))
        return r

    def __round__(self, ndigits: int | None = None) -> Sym:
        # an inference tape rounds each size when it is evaluated; a step's tape (``RECORDING.whole``) serves
        # only the points where a size with a fraction is a whole number, as it is here (a congruence guard)
        if RECORDING.whole:
            for v in self.c.values():
                if type(v) is not int and v != int(v):
                    self % 1
                    break
        return self

    def _unsupported(self) -> int:
        raise TapeUnsupported("a size used as a plain number (int, float, ceil, index)")

    __int__ = __index__ = __float__ = __ceil__ = __floor__ = _unsupported  # type: ignore[assignment]

    def _guard(self, other: Any, op: str) -> bool:
        res = _OPS[op](self.v, other.v if isinstance(other, Sym) else other)
        # the same polynomial on both sides (a gradient's bytes against its input's: the backward engine's
        # validate_outputs) compares the same way at every point: no guard
        if RECORDING.guards is not None and not (type(other) is Sym and other.c == self.c):
            diff = self._add(other, -1) if isinstance(other, Sym) or other else self
            RECORDING.guards.append((dict(diff.c), op, bool(res)))
        return bool(res)

    def __lt__(self, other: Any) -> bool:
        return self._guard(other, "<")

    def __le__(self, other: Any) -> bool:
        return self._guard(other, "<=")

    def __gt__(self, other: Any) -> bool:
        return self._guard(other, ">")

    def __ge__(self, other: Any) -> bool:
        return self._guard(other, ">=")

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        return self._guard(other, "==")

    def __ne__(self, other: object) -> bool:  # type: ignore[override]
        return self._guard(other, "!=")

    def __bool__(self) -> bool:
        return self._guard(0, "!=")


def whole(c: dict[Mono, Any]) -> tuple[dict[Mono, int], int]:
    """The polynomial times the least common denominator of its coefficients (whole coefficients), and that
    denominator (floats count as the binary fractions they are)."""
    den = 1
    for v in c.values():
        if not isinstance(v, int):
            den = lcm(den, Fraction(v).denominator)
    if den == 1:
        return {k: int(v) for k, v in c.items()}, 1  # type: ignore[call-overload]
    return {k: int(Fraction(v) * den) for k, v in c.items()}, den


def chunks(q: object, size: object) -> int:
    """``ceil(q / size)``, the chunks of a padded sequence; the comparisons that pin it down become the tape's
    guards, so a tape serves every length with the same number of chunks."""
    n = max(1, -(-int(getattr(q, "v", q)) // int(getattr(size, "v", size))))
    if not (q > size * (n - 1) and q <= size * n):  # type: ignore[operator]
        raise AssertionError(f"{q} tokens do not make {n} chunks of {size}")
    return n
