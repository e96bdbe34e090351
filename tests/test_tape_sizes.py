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


def _moments_by_loop(events: list, positive: np.ndarray) -> dict[str, list[int]]:
    """The moments the tracker compares with its peak, read event by event (the reading before it was one
    array expression)."""
    out: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        nxt = events[i + 1] if i + 1 < len(events) else None
        if e[6] and not (nxt is not None and nxt[6] and nxt[5] == e[5] and positive[i + 1]):
            out.setdefault(e[5], []).append(i)
    return out


_event = st.tuples(
    st.sampled_from([1, -1]),
    st.integers(0, 10**6),
    st.sampled_from(["act", "temp", "grad", ""]),
    st.sampled_from(["hidden_states", "mlp", "gradients"]),
    st.just("here"),
    st.sampled_from(["forward", "backward", "optimizer"]),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(_event, max_size=700))
def test_phase_table_moments_and_checkpoints_match_a_loop(events: list) -> None:
    # more than two _EVERY blocks of events at the largest: the checkpoints' running sums cross blocks
    from types import SimpleNamespace

    from gpumem_gui.core.replay.tape_phases import _EVERY, PhaseTable

    table = PhaseTable(SimpleNamespace(events=events, seen={}), [(0, 0, 0)])  # type: ignore[arg-type]
    sizes = np.array([[s * n] for s, n, *_ in events], dtype=np.float64).reshape(len(events), 1)
    positive = (sizes >= 0).all(axis=1) & (sizes > 0).any(axis=1)
    want = _moments_by_loop(events, positive)
    assert list(table.phases) == list(want)
    for name, (idx, _) in table.phases.items():
        assert idx.tolist() == want[name]
    classes = list(dict.fromkeys((e[2], e[3]) for e in events))
    assert table.cls.tolist() == [classes.index((e[2], e[3])) for e in events]
    for k in range(len(table.checkpoints)):
        run = np.zeros((len(classes), 1))
        for i in range(min(k * _EVERY, len(events))):
            run[classes.index((events[i][2], events[i][3]))] += sizes[i]
        assert (table.checkpoints[k] == run).all()
