"""Each phase's peak from a tape, exactly as the tracker keeps it (:class:`~.memory.Tracker`).

The tracker compares the live bytes with the current phase's peak at two kinds of moment only: a storage
is allocated or grows (``Storage.__init__``, ``Storage.grow``), and a phase is entered (``start_phase``:
the level on entry, for a phase met again the higher of the two); a new peak must be strictly higher, so
the peak is the *first* of the highest levels at those moments, and what was live by kind and tag is the
running sum up to it. A :class:`PhaseTable` keeps, per phase, the level polynomials of those moments (the
running sum of the signed event sizes) and evaluates them at a point: a matrix product and an ``argmax``
per phase, then the bytes by kind and tag summed up to the chosen event (from a checkpoint of the running
sums every ``_EVERY`` events). A moment directly followed, in the same phase, by an allocation that is
positive at every point (non-negative coefficients, one of them on a monomial without ``p``, which is at
least 1) can never be the first highest and is left out.

To the byte: sizes are kept times the least common denominator of their coefficients (a size ``(x - r) /
d`` of a division the congruence guards pin, or a float factor); a point must make every size with a
fraction a whole number of bytes (else the replay would have rounded it: :class:`~.sym.TapeUnsupported`,
and the caller replays) and keep every sum below 2**53 (float64 adds whole numbers exactly up to there;
checked per point against the sum of all coefficients' magnitudes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from typing import TYPE_CHECKING, Any

import numpy as np

from gpumem_gui.core.replay.memory import KINDS
from gpumem_gui.core.replay.sym import Mono, TapeUnsupported, poly

if TYPE_CHECKING:
    from gpumem_gui.core.replay.tape import TapeTracker

_EVERY = 256  # events between two checkpoints of the running bytes by kind and tag (definition: a trade-off)
_MAX_DEN = 1 << 16  # a larger common denominator comes from a float factor, not a division (definition)
EXACT = float(1 << 53)  # float64 holds every whole number below this (IEEE 754 binary64: 53-bit significand)


@dataclass(frozen=True)
class PhaseAt:
    """One phase's peak at a point: total bytes, bytes by kind and by tag, where it happened (the tracker's
    ``peaks[phase]``)."""

    total: int
    by_kind: dict[str, int]
    by_tag: dict[str, int]
    where: str


class PhaseTable:
    """Per phase, the levels where the tracker looks for a peak, and the running bytes by kind and tag."""

    def __init__(self, tr: TapeTracker, monos: list[Mono]) -> None:
        events = tr.events
        self.sizes, self.den, frac = integer_sizes(events, monos)
        fractional = {tuple(self.sizes[i]): None for i in frac}  # each such row once
        self.fractional = np.array(list(fractional)) if fractional else None
        self.bound = np.abs(self.sizes).sum(axis=0)
        level = np.cumsum(self.sizes, axis=0)
        self.where = [e[4] for e in events]
        self.phases: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        no_p = np.array([1.0 if mono[2] == 0 else 0.0 for mono in monos])
        for name, idx in _moments(events, self.sizes, no_p).items():
            self.phases[name] = (idx, level[idx])
        self._classes(events)
        self.seen = list(tr.seen.items())

    def _classes(self, events: list[Any]) -> None:
        """(kind, tag) of every event, and the running bytes of each at every ``_EVERY``-th event."""
        pairs = [(e[2], e[3]) for e in events]
        classes = {k: i for i, k in enumerate(dict.fromkeys(pairs))}  # in order of first appearance
        cls = np.fromiter(map(classes.__getitem__, pairs), np.int64, len(pairs))
        self.cls = cls
        self.n_cls = len(classes)
        keys = list(classes)
        self.kind_of = np.array([KINDS.index(k) if k in KINDS else len(KINDS) for k, _ in keys], np.int64)
        tags = list(dict.fromkeys(t for _, t in keys))
        self.tag_names = tags
        self.tag_of = np.array([tags.index(t) for _, t in keys], dtype=np.int64)
        n = len(events)
        # checkpoint k: the bytes of each class over the events before k * _EVERY (each block's sums, then
        # a running sum over the blocks: whole numbers below 2**53, exact in any order)
        ck = np.zeros((n // _EVERY + 1, self.n_cls, self.sizes.shape[1]))
        block = np.arange(n) // _EVERY + 1
        inside = block < len(ck)
        np.add.at(ck, (block[inside], cls[inside]), self.sizes[inside])
        np.cumsum(ck, axis=0, out=ck)
        self.checkpoints = ck

    def peaks(self, m: np.ndarray, only: tuple[str, ...]) -> dict[str, PhaseAt]:
        """The peaks of the phases ``only`` that were entered at the point of monomials ``m``, in the order
        they were first entered."""
        if float(self.bound @ m) >= EXACT:
            raise TapeUnsupported("a point whose byte sums pass 2**53 (float64 is no longer exact)")
        if self.fractional is not None and np.fmod(self.fractional @ m, self.den).any():
            raise TapeUnsupported("a size that is not a whole number of bytes at this point")
        out: dict[str, PhaseAt] = {}
        for name, (idx, levels) in self.phases.items():
            if name not in only:
                continue
            lv = levels @ m
            j = int(np.argmax(lv))
            out[name] = self._at(int(idx[j]), int(lv[j]) // self.den, m)
        return out

    def _at(self, at: int, total: int, m: np.ndarray) -> PhaseAt:
        k = (at + 1) // _EVERY
        lo = k * _EVERY
        by_cls = self.checkpoints[k] @ m
        if lo <= at:
            by_cls = by_cls + np.bincount(self.cls[lo : at + 1], self.sizes[lo : at + 1] @ m, self.n_cls)
        kinds = np.bincount(self.kind_of, by_cls, len(KINDS) + 1)
        tags = np.bincount(self.tag_of, by_cls, len(self.tag_names))
        den = self.den
        tag_bytes = {t: int(v) // den for t, v in zip(self.tag_names, tags, strict=True)}
        return PhaseAt(
            total=total,
            by_kind={k: int(v) // den for k, v in zip(KINDS, kinds, strict=False)},
            by_tag={t: tag_bytes.get(t, 0) for t, pos in self.seen if pos <= at},
            where=self.where[at],
        )


def _moments(events: list[Any], sizes: np.ndarray, no_p: np.ndarray) -> dict[str, np.ndarray]:
    """Per phase (in order of first entry), the events at which the tracker compares with the peak, less
    those an always-positive allocation right after in the same phase outdoes (``no_p``: 1 on the monomials
    without the cached tokens ``p``, at least 1 at every point)."""
    positive = (sizes >= 0).all(axis=1) & ((sizes * no_p) > 0).any(axis=1)
    n = len(events)
    peak = np.fromiter((e[6] for e in events), bool, n)
    names = [e[5] for e in events]
    codes = {name: i for i, name in enumerate(dict.fromkeys(names))}
    phase = np.fromiter(map(codes.__getitem__, names), np.int64, n)
    outdone = np.zeros(n, dtype=bool)
    outdone[:-1] = peak[1:] & (phase[1:] == phase[:-1]) & positive[1:]
    idx = np.flatnonzero(peak & ~outdone)
    kept = phase[idx]
    name_of = list(codes)
    return {name_of[c]: idx[kept == c] for c in dict.fromkeys(kept.tolist())}


class _Distinct(threading.local):
    """The distinct sizes of the tape being built (:func:`distinct_sizes`), else None."""

    def __init__(self) -> None:
        self.sizes: DistinctSizes | None = None


_DISTINCT = _Distinct()


class DistinctSizes:
    """The distinct sizes of a tape's events, each polynomial read once: a storage's size is one object at its
    allocation and its free, in the tracker's events and in the allocator's stream alike, so the sizes are
    told apart by identity (``id``: every one is alive while the tape is built, so no two share one)."""

    def __init__(self, *sizes: list[Any]) -> None:
        objs = [x for part in sizes for x in part]
        self._keep = objs  # alive while these are: no other object can take one of their ids
        self.ids, first = np.unique(_ids(objs), return_index=True)
        self.polys = polys = [poly(objs[i]) for i in first.tolist()]
        # every coefficient once, flattened (which size, monomial, value): the rows are one scatter
        self._owner = np.repeat(np.arange(len(polys), dtype=np.int64), [len(c) for c in polys])
        self._flat_monos = [m for c in polys for m in c]
        self._flat_values = [v for c in polys for v in c.values()]
        self.dens: list[int] = [1] * len(polys)  # each polynomial's least common denominator (1: whole)
        self.fracs = np.zeros(len(polys), dtype=bool)  # a coefficient that is not an int
        if set(map(type, self._flat_values)) - {int}:  # a fraction or a float somewhere: find whose
            for k, c in enumerate(polys):
                den = 1
                for v in c.values():
                    if type(v) is not int:
                        self.fracs[k] = True
                        den = lcm(den, Fraction(v).denominator)
                self.dens[k] = den
        self._dens = np.array(self.dens, dtype=object)
        self._rows: tuple[list[Mono], dict[int, np.ndarray]] | None = None

    def monos(self) -> set[Mono]:
        return {m for c in self.polys for m in c}

    def index(self, sizes: list[Any]) -> np.ndarray | None:
        """The index of each of ``sizes`` among the distinct ones; None where one is not among them."""
        ids = _ids(sizes)
        at = np.searchsorted(self.ids, ids)
        if len(ids) and (at.max() >= len(self.ids) or (self.ids[at] != ids).any()):
            return None
        return at

    def rows(self, monos: list[Mono], den: int) -> np.ndarray:
        """Every distinct size as a row over ``monos``, times ``den`` (whole numbers when den > 1)."""
        if self._rows is None or self._rows[0] is not monos:
            self._rows = (monos, {})
        done = self._rows[1].get(den)
        if done is not None:
            return done
        index = {m: i for i, m in enumerate(monos)}
        index.setdefault((0, 0, 0), -1)  # an int size's column (the last when the tape has no constant)
        cols = np.fromiter(map(index.__getitem__, self._flat_monos), np.int64, len(self._flat_monos))
        vals = self._flat_values if den == 1 else [int(Fraction(v) * den) for v in self._flat_values]
        out = np.zeros((len(self.polys), len(monos)))
        out[self._owner, cols] = np.array(vals, dtype=np.float64)  # one coefficient per (size, monomial)
        self._rows[1][den] = out
        return out

    def lcm_of(self, which: np.ndarray) -> int:
        """The least common denominator of the sizes ``which`` (indices)."""
        if not self.fracs.any():
            return 1
        return lcm(*set(self._dens[which].tolist()))


def _ids(objs: list[Any]) -> np.ndarray:
    return np.fromiter(map(id, objs), dtype=np.uint64, count=len(objs))


@contextmanager
def distinct_sizes(sizes: DistinctSizes) -> Iterator[DistinctSizes]:
    """While a tape is built, :func:`integer_sizes` reads the distinct sizes of ``sizes`` once."""
    _DISTINCT.sizes = sizes
    try:
        yield sizes
    finally:
        _DISTINCT.sizes = None


def integer_sizes(events: list[Any], monos: list[Mono]) -> tuple[np.ndarray, int, list[int]]:
    """The signed sizes of ``events`` as rows over ``monos``, times the least common denominator of their
    coefficients (returned), and the events whose size has a fraction."""
    return integer_rows([e[0] for e in events], [e[1] for e in events], monos)


def integer_rows(signs: list[int], objs: list[Any], monos: list[Mono]) -> tuple[np.ndarray, int, list[int]]:
    """:func:`integer_sizes` of the events of signs ``signs`` and sizes ``objs``."""
    sizes = _DISTINCT.sizes
    which = None if sizes is None else sizes.index(objs)
    if sizes is None or which is None:
        sizes = DistinctSizes(objs)
        which = sizes.index(objs)
        assert which is not None
    sign = np.array(signs, dtype=np.float64)
    den = sizes.lcm_of(which)
    if den > _MAX_DEN:
        raise TapeUnsupported(f"sizes with fractions of 1/{den} (a float factor)")
    frac = np.flatnonzero(sizes.fracs[which]).tolist()
    return sizes.rows(monos, den)[which] * sign[:, None], den, frac
