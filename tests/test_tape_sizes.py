"""The tape's size rows (:func:`~gpumem_gui.core.replay.tape_phases.integer_sizes`): each distinct size read
once (by identity, shared between the phases and the stream while a tape is built) gives the rows a direct
reading of every event gives, to the bit."""

from __future__ import annotations

from fractions import Fraction
from math import lcm

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_gui.core.replay.sym import Sym, poly
from gpumem_gui.core.replay.tape_phases import DistinctSizes, distinct_sizes, integer_sizes

MONOS = [(0, 0, 0), (0, 1, 0), (1, 1, 0), (1, 2, 0), (0, 0, 1)]


def _direct(events: list, monos: list) -> tuple[np.ndarray, int, set[int]]:
    """Every event's size read on its own (the reading before sizes were shared)."""
    den = 1
    frac = set()
    for i, e in enumerate(events):
        for c in poly(e[1]).values():
            if type(c) is not int:
                den = lcm(den, Fraction(c).denominator)
                frac.add(i)
    out = np.zeros((len(events), len(monos)))
    for i, (sign, size, *_) in enumerate(events):
        for m, c in poly(size).items():
            out[i, monos.index(m)] = sign * c if den == 1 else int(Fraction(sign * c) * den)
    return out, den, frac


_coef = st.one_of(st.integers(-(10**6), 10**6), st.fractions(max_denominator=8), st.sampled_from([0.5, 2.0]))
_poly = st.dictionaries(st.sampled_from(MONOS), _coef, min_size=1, max_size=3)
_size = st.one_of(st.integers(0, 10**9), _poly.map(lambda c: Sym(c, 0)))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(_size, min_size=1, max_size=12),
    picks=st.lists(st.tuples(st.sampled_from([1, -1]), st.integers(0, 11)), max_size=40),
    shared=st.booleans(),
)
def test_rows_are_each_events_own(sizes: list, picks: list, shared: bool) -> None:
    # one size object met several times (a storage's allocation and free), ints by value
    events = [(sign, sizes[k % len(sizes)], "activation", "t") for sign, k in picks]
    stream = [(1, size) for _, size, *_ in reversed(events)]
    if shared:
        with distinct_sizes(DistinctSizes([e[1] for e in events], [e[1] for e in stream])):
            got = [integer_sizes(events, MONOS), integer_sizes(stream, MONOS)]
    else:
        got = [integer_sizes(events, MONOS), integer_sizes(stream, MONOS)]
    for (rows, den, frac), evs in zip(got, (events, stream), strict=True):
        want, want_den, want_frac = _direct(evs, MONOS)
        assert den == want_den and set(frac) == want_frac
        assert rows.shape == want.shape and (rows == want).all()


def test_a_size_not_among_the_shared_ones_is_read_on_its_own() -> None:
    a, b = Sym({(0, 1, 0): 4}, 8), Sym({(1, 1, 0): Fraction(1, 2)}, 1)
    with distinct_sizes(DistinctSizes([a])):
        rows, den, frac = integer_sizes([(1, a), (-1, b)], MONOS)
    assert den == 2 and frac == [1]
    assert rows.tolist() == [[0, 8, 0, 0, 0], [0, 0, -1, 0, 0]]
