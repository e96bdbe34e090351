"""Record a forward once, evaluate it for many (batch, tokens, past) points: the replay's op tape.

An inference forward allocates and frees the same tensors in the same order for every batch size and sequence
length of one structure; only the sizes change, and each size is a polynomial in the batch ``b``, the new
tokens ``q`` and the cached tokens ``p`` (``b*q*h``, ``b*heads*q*(p+q)``, ...). :func:`record` runs the replay
once with :class:`Sym` sizes: numbers that carry their polynomial and their value at the point being recorded.
Every comparison the replay makes on a size (is the query a single token, does the key length reach the
sliding window, which of two broadcast operands is larger) is answered from the value and kept as a *guard*.
The result is a :class:`Tape`: the signed size polynomial, tag and place of every allocation and free, and the
guards. A tape serves any point at which all its guards answer as they did when it was recorded (a tracing
JIT's guards); :meth:`Tape.evaluate` is then a matrix product and a running sum instead of a replay.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.memory import Storage, Tracker

Mono = tuple[int, int, int]  # exponents of (b, q, p)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def _sign(guard: tuple[dict[Mono, float], str, bool], point: tuple[int, int, int]) -> int:
    value = sum(c * point[0] ** m[0] * point[1] ** m[1] * point[2] ** m[2] for m, c in guard[0].items())
    return (value > 0) - (value < 0)


class TapeUnsupported(Exception):
    """The replay did something a tape cannot express (a division that is not exact)."""


class _Recording:
    guards: list[tuple[dict[Mono, float], str, bool]] | None = None


def _poly(x: Sym | int | float) -> dict[Mono, float]:
    if isinstance(x, Sym):
        return x.c
    return {(0, 0, 0): x} if x else {}


class Sym:
    """A size as a polynomial in (b, q, p) with its value at the recorded point; comparisons become guards."""

    __slots__ = ("c", "v")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, c: dict[Mono, float], v: float) -> None:
        self.c = c
        self.v = v

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
        if isinstance(other, Sym):
            c: dict[Mono, float] = {}
            for k1, v1 in self.c.items():
                for k2, v2 in other.c.items():
                    k = (k1[0] + k2[0], k1[1] + k2[1], k1[2] + k2[2])
                    c[k] = c.get(k, 0) + v1 * v2
            return Sym(c, self.v * other.v)
        return Sym({k: v * other for k, v in self.c.items()}, self.v * other)

    __rmul__ = __mul__

    def __floordiv__(self, other: int) -> Sym:
        if isinstance(other, Sym) or any(v % other for v in self.c.values()):
            raise TapeUnsupported(f"inexact division of a size by {other!r}")
        return Sym({k: v // other for k, v in self.c.items()}, self.v // other)

    def __round__(self, ndigits: int | None = None) -> Sym:
        return self  # sizes are rounded when a tape is evaluated

    def _guard(self, other: Any, op: str) -> bool:
        res = _OPS[op](self.v, other.v if isinstance(other, Sym) else other)
        if _Recording.guards is not None:
            diff = self._add(other, -1) if isinstance(other, Sym) or other else self
            _Recording.guards.append((dict(diff.c), op, bool(res)))
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


class TapeTracker(Tracker):
    """A tracker that logs every allocation and free instead of following the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, Sym | int, str, str]] = []  # (sign, size, tag, where)

    def retag(self, st: Storage, kind: str, tag: str) -> None:
        if _poly(st.nbytes):
            self.events.append((-1, st.nbytes, st.tag, self.where))
            self.events.append((1, st.nbytes, tag, self.where))
        st.kind, st.tag = kind, tag


class TapeStorage(Storage):
    """A storage whose allocation, growth and free are logged on a :class:`TapeTracker`."""

    __slots__ = ()

    def __init__(self, tr: Tracker, nbytes: Any, kind: str, tag: str) -> None:
        self.tr = tr
        self.nbytes = nbytes
        self.kind = kind
        self.tag = tag
        if _poly(nbytes):
            tr.events.append((1, nbytes, tag, tr.where))  # type: ignore[attr-defined]

    def grow(self, delta: Any) -> None:
        self.nbytes = self.nbytes + delta
        if _poly(delta):
            self.tr.events.append((1, delta, self.tag, self.tr.where))  # type: ignore[attr-defined]

    def __del__(self) -> None:
        if _poly(self.nbytes):
            self.tr.events.append((-1, self.nbytes, self.tag, self.tr.where))  # type: ignore[attr-defined]


class TapeSim(Sim):
    """The symbolic runtime with a tape instead of a peak tracker (gradients off: inference only)."""

    def __init__(self) -> None:
        super().__init__()
        self.tr = TapeTracker()
        self.grad_enabled = False

    def storage(self, nbytes: Any, tag: str, kind: str | None = None) -> Storage:
        return TapeStorage(self.tr, nbytes, kind or self.phase_kind, tag)

    def new(self, n: Any, dt: str, tag: str | None = None) -> Any:
        from gpumem_gui.core.replay.memory import DT_BYTES, T

        return T(TapeStorage(self.tr, n * DT_BYTES[dt], self.phase_kind, tag or self.region), n, dt)


@dataclass(frozen=True)
class TapeResult:
    """A tape evaluated at one point: the peak, where it happened, bytes by tag at it, and named values."""

    peak: int
    where: str
    by_tag: dict[str, int]
    values: dict[str, int]


class Tape:
    """Signed size polynomials of every event, their tags and places, the guards, and named polynomials."""

    def __init__(
        self,
        events: list[tuple[int, Sym | int, str, str]],
        guards: list[tuple[dict[Mono, float], str, bool]],
        named: dict[str, Sym | int],
        point: tuple[int, int, int],
    ) -> None:
        monos = sorted(
            {m for _, size, _, _ in events for m in _poly(size)}
            | {m for g in guards for m in g[0]}
            | {m for v in named.values() for m in _poly(v)}
        )
        index = {m: i for i, m in enumerate(monos)}
        self.mono_exps = monos or [(0, 0, 0)]

        def row(poly: dict[Mono, float], sign: int = 1) -> list[float]:
            r = [0.0] * len(self.mono_exps)
            for m, v in poly.items():
                r[index[m]] = sign * v
            return r

        self.sizes = np.array([row(_poly(size), sign) for sign, size, _, _ in events] or [row({})])
        self.tags = sorted({tag for _, _, tag, _ in events})
        tag_index = {t: i for i, t in enumerate(self.tags)}
        self.onehot = np.zeros((len(self.tags), len(events)))
        for j, (_, _, tag, _) in enumerate(events):
            self.onehot[tag_index[tag], j] = 1.0
        self.where = [w for _, _, _, w in events]
        # a guard holds where its polynomial has the sign it had when recorded (every comparison is a function
        # of that sign); repeated comparisons are kept once
        unique = {tuple(row(g[0])): g for g in guards}
        self.guard_rows = np.array(list(unique)) if unique else None
        self.guard_signs = np.array([_sign(g, point) for g in unique.values()])
        self.named = {k: np.array(row(_poly(v))) for k, v in named.items()}

    def monomials(self, point: tuple[int, int, int]) -> np.ndarray:
        """The tape's monomials of (b, q, p) at ``point``."""
        b, q, p = point
        return np.array([b**e0 * q**e1 * p**e2 for e0, e1, e2 in self.mono_exps], dtype=np.float64)

    def admits(self, m: np.ndarray) -> bool:
        """Whether every guard answers at the point of monomials ``m`` as when the tape was recorded."""
        if self.guard_rows is None:
            return True
        return bool((np.sign(self.guard_rows @ m) == self.guard_signs).all())

    def evaluate(self, m: np.ndarray) -> TapeResult:
        """The tape at the point of monomials ``m``."""
        signed = np.rint(self.sizes @ m)
        level = np.cumsum(signed)
        at = int(np.argmax(level))
        by_tag = self.onehot[:, : at + 1] @ signed[: at + 1]
        return TapeResult(
            peak=int(level[at]),
            where=self.where[at],
            by_tag={t: int(v) for t, v in zip(self.tags, by_tag, strict=True)},
            values={k: int(np.rint(v @ m)) for k, v in self.named.items()},
        )


def record(
    run: Callable[[TapeSim, Sym, Sym, Sym], dict[str, Sym | int]], point: tuple[int, int, int]
) -> Tape:
    """Run ``run(sim, b, q, p)`` with symbolic sizes valued at ``point``; what it returns is kept as named
    polynomials (e.g. the cache bytes at the end)."""
    b, q, p = (Sym.var(i, v) for i, v in enumerate(point))
    _Recording.guards = guards = []
    try:
        sim = TapeSim()
        named = run(sim, b, q, p)
        events = sim.tr.events  # type: ignore[attr-defined]
        del sim
    finally:
        _Recording.guards = None
    return Tape(events, guards, named, point)
