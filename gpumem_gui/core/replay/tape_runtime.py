"""The runtime a tape records on: a tracker that logs every allocation, free, retag and phase change with
:class:`~.sym.Sym` sizes (:class:`TapeTracker`), its storages, and the symbolic runtime around it
(:class:`TapeSim`). :mod:`.tape` turns the log into a :class:`~.tape.Tape`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumem_gui.core.allocator.events import ALLOC, FREE, GROW, PHASE
from gpumem_gui.core.replay.autograd import ReplayHooks, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, KINDS, Storage, T, Tracker
from gpumem_gui.core.replay.sym import RECORDING, Mono, Sym

# one event: (sign, size, kind, tag, where, phase, whether the tracker compares the level with its peak there)
Event = tuple[int, Any, str, str, str, str, bool]
ENTRY = ""  # the kind of a phase-entry event (no bytes; the level there may be the phase's peak)


class TapeTracker(Tracker):
    """A tracker that logs every allocation, free, retag and phase change instead of following the peak.

    Its live bytes (``cur``, ``by_kind``, ``by_tag``) are polynomials too, summed from the log when the
    replay reads them (the training step reads them a few times per micro-batch, a scan once per
    iteration); ``seen`` keeps where each tag first appeared (the tracker's ``by_tag`` holds a tag from its
    first storage on, empty or not).

    ``alloc_log``, when a list, takes the allocator's event stream as :class:`~.memory.Tracker` logs it, with
    :class:`~.sym.Sym` sizes and each storage's ordinal as its identity (``handles`` counts them): the
    identities :func:`~gpumem_gui.core.allocator.events.normalize` gives the replay's stream."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.where = ""
        self.peaks: dict[str, tuple[int, dict[str, int], dict[str, int], str]] = {}
        self.events: list[Event] = []
        self.seen: dict[str, int] = {}
        self._upto = 0
        self._classes: dict[tuple[str, str], dict[Mono, Any]] = {}
        self.handles = 0

    def log(self, sign: int, size: Any, kind: str, tag: str, peak: bool) -> None:
        if tag not in self.seen:
            self.seen[tag] = len(self.events)
        # an empty allocation is still a moment the tracker looks for a peak (``poly(size)`` inlined: a step
        # logs ~20k events)
        if peak or (size.c if type(size) is Sym else size):
            self.events.append((sign, size, kind, tag, self.where, self.phase, peak))

    def drop_log(self) -> None:
        """Free the log and the live polynomials summed from it (the tape is built)."""
        self.events = []
        self._classes = {}
        self._upto = 0

    def retag(self, st: Storage, kind: str, tag: str) -> None:
        self.log(-1, st.nbytes, st.kind, st.tag, False)
        self.log(1, st.nbytes, kind, tag, False)
        st.kind, st.tag = kind, tag

    def start_phase(self, phase: str) -> None:
        self.phase = phase
        self.events.append((1, 0, ENTRY, "", self.where, phase, True))  # the level on entry may be the peak
        if self.alloc_log is not None:
            self.alloc_log.append((PHASE, phase, 0))

    def _sync(self) -> dict[tuple[str, str], dict[Mono, Any]]:
        """The live polynomial of each (kind, tag), summed from the events logged since the last read."""
        classes = self._classes
        for sign, size, kind, tag, _, _, _ in self.events[self._upto :]:
            if kind == ENTRY:
                continue
            acc = classes.setdefault((kind, tag), {})
            if type(size) is int:
                acc[(0, 0, 0)] = acc.get((0, 0, 0), 0) + sign * size
                continue
            for m, c in size.c.items():
                acc[m] = acc.get(m, 0) + sign * c
        self._upto = len(self.events)
        return classes

    def _total(self, keep: Callable[[str, str], bool]) -> Sym | int:
        total: dict[Mono, Any] = {}
        for (kind, tag), c in self._sync().items():
            if keep(kind, tag):
                for m, v in c.items():
                    total[m] = total.get(m, 0) + v
        return _value(total)

    @property  # type: ignore[override]
    def cur(self) -> Any:
        return self._total(lambda kind, tag: True)

    @property  # type: ignore[override]
    def by_kind(self) -> dict[str, Any]:
        return {k: self._total(lambda kind, tag, k=k: kind == k) for k in KINDS}  # type: ignore[misc]

    @property  # type: ignore[override]
    def by_tag(self) -> dict[str, Any]:
        return {t: self._total(lambda kind, tag, t=t: tag == t) for t in self.seen}  # type: ignore[misc]


def _value(c: dict[Mono, float]) -> Sym | int:
    """A live-bytes polynomial as the replay reads it: a :class:`Sym` valued at the recorded point."""
    c = {m: v for m, v in c.items() if v}
    if not c:
        return 0
    if set(c) == {(0, 0, 0)}:
        return c[(0, 0, 0)]  # type: ignore[return-value]
    pt = RECORDING.point
    return Sym(c, sum(v * pt[0] ** m[0] * pt[1] ** m[1] * pt[2] ** m[2] for m, v in c.items()))


class TapeStorage(Storage):
    """A storage whose allocation, growth and free are logged on a :class:`TapeTracker` (and on its
    ``alloc_log`` under its ``handle``, -1 for a storage made while nothing was logged)."""

    __slots__ = ("handle",)

    def __init__(self, tr: TapeTracker, nbytes: Any, kind: str, tag: str) -> None:
        self.tr = tr
        self.nbytes = nbytes
        self.kind = kind
        self.tag = tag
        tr.log(1, nbytes, kind, tag, True)
        self.handle = -1
        if tr.alloc_log is not None:
            self.handle = tr.handles
            tr.handles += 1
            tr.alloc_log.append((ALLOC, self.handle, nbytes))

    def grow(self, delta: Any) -> None:
        self.nbytes = self.nbytes + delta
        tr: TapeTracker = self.tr  # type: ignore[assignment]
        tr.log(1, delta, self.kind, self.tag, True)
        if tr.alloc_log is not None and self.handle >= 0:
            tr.alloc_log.append((GROW, self.handle, delta))

    def __del__(self) -> None:
        tr: TapeTracker = self.tr  # type: ignore[assignment]
        tr.log(-1, self.nbytes, self.kind, self.tag, False)
        if tr.alloc_log is not None and self.handle >= 0:
            tr.alloc_log.append((FREE, self.handle, self.nbytes))


class TapeSim(Sim):
    """The symbolic runtime with a tape instead of a peak tracker (gradients off unless ``grad``: a training
    step's tape records with them on)."""

    def __init__(self, hooks: ReplayHooks | None = None, grad: bool = False) -> None:
        super().__init__(hooks)
        self.tr = TapeTracker()
        self.grad_enabled = grad

    def storage(self, nbytes: Any, tag: str, kind: str | None = None) -> Storage:
        return TapeStorage(self.tr, nbytes, kind or self.phase_kind, tag)  # type: ignore[arg-type]

    def new(self, n: Any, dt: str, tag: str | None = None) -> Any:
        st = TapeStorage(self.tr, n * DT_BYTES[dt], self.phase_kind, tag or self.region)  # type: ignore[arg-type]
        return T(st, n, dt)
