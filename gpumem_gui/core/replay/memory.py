"""The memory side of the symbolic runtime: dtypes, storages freed by reference counting, the tracker that
records live bytes and phase peaks, and tensors (a storage, an element count, a dtype, the autograd node that
made them). :mod:`.autograd` builds the graph on top."""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.allocator.events import ALLOC, FREE, GROW, PHASE, STREAM, Event

# what made a tensor, and the parameter a tensor is (replay/autograd.py ``Node`` and ``Param``): the tensors
# carry them without naming the graph that records them, which imports this module (no import circle)
Node = Any
Param = Any

DT_BYTES: dict[str, float] = {
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "i64": 8,
    "i32": 4,
    "u8": 1,
    "bool": 1,
}
FLOATS = ("f32", "bf16", "f16")

KINDS = ("param", "buffer", "grad", "optstate", "act", "temp", "input")
# forward regions: where in the model a tensor was made (inference breaks its activations down by these)
REGIONS = ("hidden_states", "attention", "mlp", "norm", "rope", "mask", "inputs")
_NO_PEAK = -(1 << 126)  # below any byte count: the first allocation of a phase always sets its peak


def promote(a: str, b: str) -> str:
    """torch's type promotion between two tensors' dtypes (floats only matter here)."""
    if a == b:
        return a
    if a in FLOATS and b not in FLOATS:
        return a
    if b in FLOATS and a not in FLOATS:
        return b
    if "f32" in (a, b):
        return "f32"
    if {a, b} == {"bf16", "f16"}:
        return "f32"
    return a


class Tracker:
    """Live bytes by kind and tag; the peak of each phase with what was live at it and where it happened.

    ``alloc_log``: when a list, every allocation, growth and free of a storage (with its identity) and every
    phase start is appended to it in program order (:mod:`gpumem_gui.core.allocator.events`), what the
    allocator model replays; None (the default) records nothing."""

    alloc_log: list[Event] | None = None

    def __init__(self) -> None:
        self.cur = 0
        self.by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.by_tag: dict[str, int] = {}
        self.phase = "setup"
        self.where = ""
        self.peaks: dict[str, tuple[int, dict[str, int], dict[str, int], str]] = {}
        self.top = _NO_PEAK  # the current phase's peak so far (``peaks[phase][0]``), _NO_PEAK before any
        # allocations and frees are counted by Storage itself (``__init__`` / ``__del__``), the hottest path

    def retag(self, st: Storage, kind: str, tag: str) -> None:
        self.by_kind[st.kind] -= st.nbytes
        self.by_tag[st.tag] -= st.nbytes
        st.kind, st.tag = kind, tag
        self.by_kind[kind] += st.nbytes
        self.by_tag[tag] = self.by_tag.get(tag, 0) + st.nbytes

    def start_phase(self, phase: str) -> None:
        """Enter ``phase``; a phase met again (the next micro-batch) keeps the higher of its peaks."""
        self.phase = phase
        if self.alloc_log is not None:
            self.alloc_log.append((PHASE, phase, 0))
        pk = self.peaks.get(phase)
        if pk is None or self.cur > pk[0]:
            self.peaks[phase] = (self.cur, dict(self.by_kind), dict(self.by_tag), self.where)
        self.top = self.peaks[phase][0]

    def on_stream(self, stream: int) -> None:
        """The storages made from here on are allocated on CUDA stream ``stream`` (torch's current stream;
        :data:`~gpumem_gui.core.allocator.events.STREAM`): only the allocator model sees it."""
        if self.alloc_log is not None:
            self.alloc_log.append((STREAM, stream, 0))


class Storage:
    """The memory of one tensor (shared by its views); freed when the last reference goes away."""

    __slots__ = ("__weakref__", "kind", "nbytes", "tag", "tr")

    def __init__(self, tr: Tracker, nbytes: int, kind: str, tag: str) -> None:
        self.tr = tr
        self.nbytes = nbytes
        self.kind = kind
        self.tag = tag
        # count it in the tracker; a new high of the phase records what is live and where
        cur = tr.cur + nbytes
        tr.cur = cur
        tr.by_kind[kind] += nbytes
        by_tag = tr.by_tag
        by_tag[tag] = by_tag.get(tag, 0) + nbytes
        if cur > tr.top:
            tr.top = cur
            tr.peaks[tr.phase] = (cur, dict(tr.by_kind), dict(by_tag), tr.where)
        if tr.alloc_log is not None:
            tr.alloc_log.append((ALLOC, id(self), nbytes))

    def grow(self, delta: int) -> None:
        """Resize in place by ``delta`` bytes (an aggregate standing for the caches of many layers)."""
        tr = self.tr
        self.nbytes += delta
        cur = tr.cur + delta
        tr.cur = cur
        tr.by_kind[self.kind] += delta
        tr.by_tag[self.tag] += delta
        if cur > tr.top:
            tr.top = cur
            tr.peaks[tr.phase] = (cur, dict(tr.by_kind), dict(tr.by_tag), tr.where)
        if tr.alloc_log is not None:
            tr.alloc_log.append((GROW, id(self), delta))

    def __del__(self) -> None:
        tr = self.tr
        n = self.nbytes
        tr.cur -= n
        tr.by_kind[self.kind] -= n
        tr.by_tag[self.tag] -= n
        if tr.alloc_log is not None:
            tr.alloc_log.append((FREE, id(self), n))


class T:
    """A tensor: its storage, element count, dtype, whether it needs a gradient and the node that made it."""

    __slots__ = ("dt", "fn", "idx", "n", "param", "st")

    def __init__(
        self,
        st: Storage | None,
        n: int,
        dt: str,
        rg: bool = False,
        fn: Node | None = None,
        idx: int = 0,
        param: Param | None = None,
    ) -> None:
        self.st = st
        self.n = n
        self.dt = dt
        self.fn = fn if rg else None
        self.idx = idx
        self.param = param

    @property
    def rg(self) -> bool:
        return self.fn is not None

    @property
    def nbytes(self) -> int:
        return round(self.n * DT_BYTES[self.dt])

    def view(self, n: int | None = None) -> T:
        """A view of this tensor (same storage, same autograd history), ``n`` elements (default: all)."""
        return T(
            self.st, self.n if n is None else n, self.dt, self.fn is not None, self.fn, self.idx, self.param
        )
