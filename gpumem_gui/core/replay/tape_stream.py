"""The caching allocator's event stream from a tape: which storage each allocation, growth and free is, with
its size evaluated at a point.

A tape recorded with its stream (:func:`~.tape.record` ``stream=True``) keeps the events
:class:`~.tape_runtime.TapeTracker` logged on its ``alloc_log``: the operation and the storage's ordinal are
the same at every point the tape's guards admit (the same code path makes and frees the same storages in the
same order), only the sizes change, and each is a polynomial in the point's variables. :meth:`StreamTable.at`
evaluates them all as one matrix product, to the byte (the sizes are kept times the least common denominator
of their coefficients, as :mod:`.tape_phases` keeps them), and gives the stream the replay's
``Tracker.alloc_log`` gives at that point after :func:`~gpumem_gui.core.allocator.events.normalize`, without
replaying the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpumem_gui.core.allocator.events import PHASE, Event
from gpumem_gui.core.replay.sym import Mono, TapeUnsupported
from gpumem_gui.core.replay.tape_phases import EXACT, integer_rows


class StreamTable:
    """The stream's operations and storage ordinals (phase names for phase starts, CUDA stream numbers for
    the switches :meth:`~.memory.Tracker.on_stream` logs), and its sizes as rows over the tape's monomials."""

    def __init__(self, log: list[tuple[int, Any, Any]], monos: list[Mono]) -> None:
        self.ops = [e[0] for e in log]
        self.keys = [e[1] for e in log]
        sizes = [0 if e[0] == PHASE else e[2] for e in log]
        self.sizes, self.den, frac = integer_rows([1] * len(log), sizes, monos)
        self.frac = np.array(sorted(set(frac)), dtype=np.int64)
        self.bound = np.abs(self.sizes).sum(axis=0)

    def __len__(self) -> int:
        return len(self.ops)

    def at(self, m: np.ndarray) -> list[Event]:
        """The stream at the point of monomials ``m`` (:class:`~.sym.TapeUnsupported` where a size is not a
        whole number of bytes or a sum passes float64's exact range)."""
        if len(self.ops) == 0:
            return []
        if float(self.bound @ m) >= EXACT:
            raise TapeUnsupported("a point whose byte sums pass 2**53 (float64 is no longer exact)")
        values = self.sizes @ m
        if len(self.frac) and np.fmod(values[self.frac], self.den).any():
            raise TapeUnsupported("a size that is not a whole number of bytes at this point")
        whole = np.rint(values).astype(np.int64)
        if self.den > 1:
            whole //= self.den
        return list(zip(self.ops, self.keys, whole.tolist(), strict=True))
