"""Record a replay once, evaluate it for many (batch, tokens, past) points: the replay's op tape.

A forward (inference) or a training step allocates and frees the same tensors in the same order for every
batch size and sequence length of one structure; only the sizes change, and each size is a polynomial in the
batch ``b``, the new (or trained) tokens ``q`` and the cached tokens ``p`` (``b*q*h``, ``b*heads*q*(p+q)``,
...). :func:`record` runs the replay once with :class:`~.sym.Sym` sizes: numbers that carry their polynomial
and their value at the point being recorded. Every comparison the replay makes on a size (is the query a
single token, does the key length reach the sliding window, which of two broadcast operands is larger, did an
iteration leave the same bytes as the one before) is answered from the value and kept as a *guard*.

The result is a :class:`Tape`: the signed size polynomial, kind, tag, place and phase of every allocation and
free, and the guards. A tape serves any point at which all its guards answer as they did when it was recorded
(a tracing JIT's guards); :meth:`Tape.evaluate` (the forward's peak over the whole tape) and
:meth:`Tape.phase_peaks` (each phase's peak, as the tracker keeps them: :mod:`.tape_phases`) are then matrix
products and running sums instead of a replay.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from gpumem_gui.core.allocator.events import PHASE, Event
from gpumem_gui.core.replay.sym import RECORDING, Mono, Sym, TapeUnsupported, guard_sign, poly, whole
from gpumem_gui.core.replay.tape_phases import EXACT, DistinctSizes, PhaseAt, PhaseTable, distinct_sizes
from gpumem_gui.core.replay.tape_runtime import ENTRY, TapeSim, TapeTracker
from gpumem_gui.core.replay.tape_stream import StreamTable

__all__ = ["Sym", "Tape", "TapeCache", "TapeResult", "TapeSim", "TapeUnsupported", "record"]


@dataclass(frozen=True)
class TapeResult:
    """A tape evaluated at one point: the peak, where it happened, bytes by tag at it, and named values."""

    peak: int
    where: str
    by_tag: dict[str, int]
    values: dict[str, int]


class Tape:
    """Signed size polynomials of every event, their tags and places, the guards, and named polynomials;
    ``phases``: also each phase's peak as the tracker keeps it (:class:`~.tape_phases.PhaseTable`);
    ``stream``: the allocator's event stream the tracker logged (:class:`~.tape_stream.StreamTable`)."""

    def __init__(
        self,
        tr: TapeTracker,
        guards: list[tuple[dict[Mono, float], str, bool]],
        congruences: list[tuple[dict[Mono, float], int, int]],
        named: dict[str, Sym | int],
        phases: bool = False,
        stream: list[tuple[int, Any, Any]] | None = None,
    ) -> None:
        # each distinct size read once, for the monomials and the rows of the phases and the stream
        sizes = DistinctSizes([e[1] for e in tr.events], [e[2] for e in stream or () if e[0] != PHASE])
        monos = sizes.monos() | {m for g in guards for m in g[0]}
        monos |= {m for c in congruences for m in c[0]}
        self.mono_exps = sorted(monos | {m for v in named.values() for m in poly(v)}) or [(0, 0, 0)]
        self._index = {m: i for i, m in enumerate(self.mono_exps)}
        # a guard holds where its polynomial has the sign it had when recorded (every comparison is a function
        # of that sign; whole coefficients, the same sign); repeated comparisons are kept once
        distinct = {(tuple(g[0].items()), g[1]): g for g in guards}.values()
        unique = {tuple(self.row(whole(g[0])[0])): g for g in distinct}
        self.guard_rows = np.array(list(unique)) if unique else None
        self.guard_signs = np.array([guard_sign(g, RECORDING.point) for g in unique.values()])
        # a congruence holds where its polynomial leaves the remainder it left (``x // d`` and ``x % d``)
        self.congruences = list(
            {(tuple(sorted(c.items())), d, r): (c, d, r) for c, d, r in congruences}.values()
        )
        self.named = {k: np.array(self.row(poly(v))) for k, v in named.items()}
        wholes = [whole(poly(v)) for v in named.values()]  # each times its own denominator
        self._whole = np.array([self.row(w) for w, _ in wholes]).reshape(len(wholes), len(self.mono_exps))
        self._whole_abs = np.abs(self._whole)
        self._dens = [den for _, den in wholes]
        with distinct_sizes(sizes):
            self.table = PhaseTable(tr, self.mono_exps) if phases else None
            self.stream = StreamTable(stream, self.mono_exps) if stream is not None else None
        self.extra: Any = None  # what the recorded run knows beside its polynomials (the same at every point)
        # a step's tape is read by phase (:meth:`phase_peaks`), a forward's over all of it (phase entries and
        # empty storages carry no bytes)
        events = [] if phases else [e for e in tr.events if e[2] != ENTRY and poly(e[1])]
        self.sizes = np.array([self.row(poly(e[1]), e[0]) for e in events] or [self.row({})])
        self.tags = sorted({e[3] for e in events})
        self.event_tags = [e[3] for e in events]
        self.where = [e[4] for e in events]

    def row(self, c: dict[Mono, Any], sign: int = 1) -> list[float]:
        """A polynomial as coefficients of the tape's monomials."""
        r = [0.0] * len(self.mono_exps)
        for m, v in c.items():
            r[self._index[m]] = float(sign * v)
        return r

    def monomials(self, point: tuple[int, int, int]) -> np.ndarray:
        """The tape's monomials of (b, q, p) at ``point``."""
        b, q, p = point
        return np.array([b**e0 * q**e1 * p**e2 for e0, e1, e2 in self.mono_exps], dtype=np.float64)

    def admits(self, m: np.ndarray, point: tuple[int, int, int]) -> bool:
        """Whether every guard answers at ``point`` (monomials ``m``) as when the tape was recorded."""
        if self.guard_rows is not None and not (np.sign(self.guard_rows @ m) == self.guard_signs).all():
            return False
        b, q, p = point
        for c, d, r in self.congruences:  # in whole numbers: exact for any point
            x = sum(Fraction(v) * b**e0 * q**e1 * p**e2 for (e0, e1, e2), v in c.items())
            if x.denominator != 1 or x.numerator % d != r:
                return False
        return True

    def evaluate(self, m: np.ndarray) -> TapeResult:
        """The tape at the point of monomials ``m``: the highest live bytes over all of it (a forward)."""
        signed = np.rint(self.sizes @ m)
        level = np.cumsum(signed)
        at = int(np.argmax(level))
        tag_index = {t: i for i, t in enumerate(self.tags)}
        by_tag = np.bincount(
            [tag_index[t] for t in self.event_tags[: at + 1]], signed[: at + 1], len(self.tags)
        )
        return TapeResult(
            peak=int(level[at]),
            where=self.where[at],
            by_tag={t: int(v) for t, v in zip(self.tags, by_tag, strict=True)},
            values=self.values(m),
        )

    def phase_peaks(self, m: np.ndarray, only: tuple[str, ...]) -> dict[str, PhaseAt]:
        """The peaks of the phases ``only`` at the point of monomials ``m`` (a tape recorded with phases)."""
        assert self.table is not None, "a tape recorded without phases"
        return self.table.peaks(m, only)

    def events(self, m: np.ndarray) -> list[Event]:
        """The allocator's event stream at the point of monomials ``m`` (a tape recorded with its stream)."""
        assert self.stream is not None, "a tape recorded without its stream"
        return self.stream.at(m)

    def values(self, m: np.ndarray) -> dict[str, int]:
        """The named polynomials at the point of monomials ``m`` (rounded)."""
        return {k: int(np.rint(v @ m)) for k, v in self.named.items()}

    def exact_values(self, m: np.ndarray) -> dict[str, int]:
        """The named polynomials at the point of monomials ``m``, to the byte (:class:`TapeUnsupported` where
        one is not a whole number, or past float64's exact range)."""
        if (self._whole_abs @ m >= EXACT).any():
            raise TapeUnsupported("a byte count past float64's exact range")
        out = {}
        for k, x, den in zip(self.named, (self._whole @ m).tolist(), self._dens, strict=True):
            if int(x) % den:
                raise TapeUnsupported(f"{k}: not a whole number of bytes at this point")
            out[k] = int(x) // den
        return out


def record(
    run: Callable[[TapeSim, Sym, Sym, Sym], dict[str, Sym | int]],
    point: tuple[int, int, int],
    sim: Callable[[], TapeSim] = TapeSim,
    phases: bool = False,
    stream: bool = False,
) -> Tape:
    """Run ``run(sim, b, q, p)`` with symbolic sizes valued at ``point``; what it returns is kept as named
    polynomials (e.g. the cache bytes at the end). ``sim`` makes the runtime (a training step's: with its
    framework's hooks and gradients on); ``phases``: keep each phase's peak (:meth:`Tape.phase_peaks`), to
    the byte (a rounded size must be whole); ``stream``: keep the allocator's event stream the tracker logs
    (:meth:`Tape.events`; the run may end it early by setting the tracker's ``alloc_log`` to None, as a
    training step does when its result is taken)."""
    b, q, p = (Sym.var(i, v) for i, v in enumerate(point))
    RECORDING.guards = guards = []
    RECORDING.congruences = congruences = []
    RECORDING.point = point
    RECORDING.whole = phases
    try:
        s = sim()
        log = s.tr.alloc_log = [] if stream else None
        named = run(s, b, q, p)
        tr = s.tr
        tr.alloc_log = None  # what is freed after the run is no part of it
        del s
        tape = Tape(tr, guards, congruences, named, phases, log)  # type: ignore[arg-type]
        # the log is read: free it now (a parameter and its AccumulateGrad node point at each other, so the
        # run's parameters, their storages and through them this tracker wait for the cyclic garbage
        # collector, which would walk every event and size of the log first)
        tr.drop_log()
        return tape
    finally:
        RECORDING.guards = None
        RECORDING.congruences = None
        RECORDING.whole = False


class TapeCache:
    """Tapes by key (a model and everything of its run but the point), several per key (one per structure
    the guards tell apart, the ``per_key`` most recent), the ``keys`` most recently used keys; and counts of
    what happened to the points of each of the last ``16 * keys`` keys (for its caller's policy). Safe to
    share between threads (the window's estimate and its background fit); recording is outside the lock."""

    def __init__(self, keys: int, per_key: int) -> None:
        self.keys = keys
        self.per_key = per_key
        self._tapes: OrderedDict[Any, list[Tape]] = OrderedDict()
        self._counts: OrderedDict[Any, Counter[str]] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, key: Any, point: tuple[int, int, int]) -> tuple[Tape, np.ndarray] | None:
        """A tape of ``key`` whose guards admit ``point`` and the point's monomials, else None."""
        with self._lock:
            tapes = self._tapes.get(key)
            if tapes is None:
                return None
            self._tapes.move_to_end(key)
            tapes = list(tapes)
        for tape in tapes:
            m = tape.monomials(point)
            if tape.admits(m, point):
                return tape, m
        return None

    def find_any(self, key: Any) -> bool:
        """Whether ``key`` has a tape (for some structure)."""
        return key in self._tapes

    def count(self, key: Any, what: str, add: int = 0) -> int:
        """How many points of ``key`` went ``what`` way (after adding ``add``)."""
        with self._lock:
            counts = self._counts.pop(key, None) or Counter()
            counts[what] += add
            self._counts[key] = counts
            if len(self._counts) > 16 * self.keys:
                self._counts.popitem(last=False)
            return counts[what]

    def add(self, key: Any, tape: Tape) -> None:
        """Keep ``tape`` under ``key``."""
        with self._lock:
            tapes = self._tapes.setdefault(key, [])
            self._tapes.move_to_end(key)
            tapes.insert(0, tape)
            del tapes[self.per_key :]
            if len(self._tapes) > self.keys:
                self._tapes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._tapes.clear()
            self._counts.clear()
