"""Layer repetition in a recorded training step (issue 30): which decoder layers' event segments repeat.

A step's tape logs each decoder layer's events, per phase, as one contiguous segment (the tracker's ``where``
names the layer: ``layer 7 attention``, set by the blocks, ``replay/block.py`` ``decoder_layer``). In most
layouts the middle layers' segments are the same polynomials in the same order; only boundary layers differ
(the first layer's backward, which makes no gradient for the embedding's output; FSDP2's last unit; ZeRO-3's
prefetch at the end; a pipeline stage's first layer). :func:`layer_periods` finds, per phase, each run of
consecutive layers whose segments are equal: the same signed sizes as polynomials, kinds, tags, places (the
layer's index taken out), peak moments, and the same guards and congruences recorded while the segment ran
(:class:`MarkedTracker` marks where they fall). A run of two or more proves the period over those layers only:
a layer differing in kind, shape, hooks, checkpointing or unit ends the run, and a phase whose layers do not
each form one contiguous segment has none (the caller replays in full).

:func:`splice` rebuilds an event list from a run's first segment: the run's segments replaced by copies of it,
each with its own layer's index in its places, the live bytes following from the events themselves. Used to
check a spliced tape against the full recording (``tests/test_tape_period.py``); the replay does not skip
layers yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpumem_gui.core.replay.sym import RECORDING, poly
from gpumem_gui.core.replay.tape_runtime import ENTRY, TapeSim, TapeTracker

# the place of an event inside a decoder layer, as the blocks set it (replay/block.py, altup.py, encoder.py)
LAYER = re.compile(r"\blayer (\d+)\b")


@dataclass(frozen=True)
class Segment:
    """The events ``[start, end)`` of a tape: one decoder layer's, in one phase."""

    phase: str
    layer: int
    start: int
    end: int


@dataclass(frozen=True)
class Period:
    """Consecutive layers of one phase whose segments are equal (``segments`` in event order, two or more)."""

    phase: str
    segments: tuple[Segment, ...]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(s.layer for s in self.segments)


class MarkedTracker(TapeTracker):
    """A tape tracker that also keeps, per logged event, how many guards and congruences were recorded before
    it (``marks``): the guards of events ``[a, b)`` are ``guards[marks[a][0]:marks[b][0]]``."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[int, int]] = []

    def log(self, sign: int, size: Any, kind: str, tag: str, peak: bool) -> None:
        n = len(self.events)
        super().log(sign, size, kind, tag, peak)
        if len(self.events) > n:
            self.marks.append((len(RECORDING.guards or ()), len(RECORDING.congruences or ())))

    def start_phase(self, phase: str) -> None:
        super().start_phase(phase)
        self.marks.append((len(RECORDING.guards or ()), len(RECORDING.congruences or ())))

    def drop_log(self) -> None:
        """Keep the log, its marks, the guards and congruences recorded (``kept``) and where each tag first
        appeared (``kept_seen``) as the tape is built."""
        self.kept = (self.events, self.marks, list(RECORDING.guards or ()), list(RECORDING.congruences or ()))
        self.kept_seen = dict(self.seen)
        super().drop_log()


class MarkedSim(TapeSim):
    """:class:`~.tape_runtime.TapeSim` on a :class:`MarkedTracker`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tr = MarkedTracker()


def layer_segments(events: list[Any]) -> list[Segment] | None:
    """The layer segments of ``events`` in order (events outside any layer belong to none); None where a
    layer's events within one visit of a phase (a micro-batch's forward, its backward) are not contiguous (no
    segment to repeat)."""
    segs: list[Segment] = []
    keys: list[tuple[int, int]] = []  # (visit, layer) of each segment
    cur: tuple[str, int, int] | None = None
    visit, phase = 0, None
    for k, e in enumerate(events):
        if e[5] != phase:
            visit, phase = visit + 1, e[5]
        m = LAYER.search(e[4]) if e[2] != ENTRY else None  # a phase's entry keeps the last place: no layer's
        key = (e[5], int(m.group(1))) if m else None
        if cur is not None and key == cur[:2] and keys[-1][0] == visit:
            continue
        if cur is not None:
            segs[-1] = Segment(cur[0], cur[1], cur[2], k)
        cur = (*key, k) if key is not None else None
        if key is not None:
            segs.append(Segment(key[0], key[1], k, k))
            keys.append((visit, key[1]))
    if cur is not None:
        segs[-1] = Segment(cur[0], cur[1], cur[2], len(events))
    return segs if len(set(keys)) == len(keys) else None


def _event_key(e: Any) -> tuple[Any, ...]:
    return (e[0], tuple(sorted(poly(e[1]).items())), e[2], e[3], LAYER.sub("layer", e[4]), e[5], e[6])


def _recorded_key(items: list[Any]) -> tuple[Any, ...]:
    """Guards ``(polynomial, op, answer)`` or congruences ``(polynomial, modulus, remainder)``, comparable."""
    return tuple((tuple(sorted(x[0].items())), *x[1:]) for x in items)


def segment_key(
    events: list[Any],
    seg: Segment,
    marks: list[tuple[int, int]] | None = None,
    guards: list[Any] | None = None,
    congruences: list[Any] | None = None,
) -> tuple[Any, ...]:
    """What must be equal for two segments to be one repeated: their events (sizes as polynomials, kinds,
    tags, places without the layer's index, phase, peak moments) and, given ``marks``, the guards and
    congruences recorded while they ran."""
    key: tuple[Any, ...] = tuple(_event_key(e) for e in events[seg.start : seg.end])
    if marks is not None:
        end = marks[seg.end] if seg.end < len(marks) else (len(guards or ()), len(congruences or ()))
        g0, c0 = marks[seg.start]
        key += (_recorded_key((guards or [])[g0 : end[0]]), _recorded_key((congruences or [])[c0 : end[1]]))
    return key


def layer_periods(
    events: list[Any],
    marks: list[tuple[int, int]] | None = None,
    guards: list[Any] | None = None,
    congruences: list[Any] | None = None,
) -> list[Period]:
    """Per phase, each run of two or more consecutive layers (ascending in the forward, descending in the
    backward: the order the segments come in) whose segments are equal (:func:`segment_key`); none where a
    layer's events are not contiguous."""
    segs = layer_segments(events)
    if segs is None:
        return []
    out: list[Period] = []
    run: list[Segment] = []
    run_key: tuple[Any, ...] | None = None
    for seg in segs:
        key = segment_key(events, seg, marks, guards, congruences)
        prev = run[-1] if run else None
        follows = (
            prev is not None
            and prev.phase == seg.phase
            and prev.end == seg.start
            and abs(prev.layer - seg.layer) == 1
            and (len(run) < 2 or seg.layer - prev.layer == prev.layer - run[-2].layer)
        )
        if follows and key == run_key:
            run.append(seg)
            continue
        if len(run) >= 2:
            out.append(Period(run[0].phase, tuple(run)))
        run, run_key = [seg], key
    if len(run) >= 2:
        out.append(Period(run[0].phase, tuple(run)))
    return out


def _relabel(where: str, layer: int) -> str:
    return LAYER.sub(f"layer {layer}", where)


def splice(events: list[Any], period: Period, copies: int) -> list[Any]:
    """``events`` with ``period``'s segments replaced by ``copies`` copies of its first, each with its own
    layer's index in its places (the layers continue the run's direction from its first)."""
    first = period.segments[0]
    step = period.segments[1].layer - first.layer
    seg = events[first.start : first.end]
    body = [
        (*e[:4], _relabel(e[4], first.layer + j * step), *e[5:]) if j else e
        for j in range(copies)
        for e in seg
    ]
    return events[: first.start] + body + events[period.segments[-1].end :]
