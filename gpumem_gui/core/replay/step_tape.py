"""A training step recorded once per model and run shape as a tape, evaluated for every (batch, tokens) point.

:func:`simulate_step_taped` is :func:`~.step.simulate_step` with the same answer to the byte: the step of
one structure (everything of the run but the micro-batch size and the tokens per sequence) is recorded with
:class:`~.sym.Sym` sizes by the same code (:func:`~.step.run_step` on a :class:`~.tape.TapeSim` with the
framework's hooks and gradients on), and a point of that structure is then each phase's peak read off the
tape (:mod:`.tape_phases`) and the step's byte counts (gradients, states, activations one micro-batch keeps,
...) evaluated as the polynomials they were recorded as. The guards send a point where a comparison of sizes
would go the other way to a tape of its own.

The first ``REPLAYED_FIRST`` points of a shape are replayed (a tape costs more to record than a replay; a
shape met once or twice never pays it), the next records the tape; a point of a shape with tapes that no
tape admits records one at once, unless the shape's tapes each served fewer than two points (a guard that
moves with every point asked: it is replayed then). A structure the tape cannot express (a size used as a
plain number, a division by a size that does not divide it: :class:`~.sym.TapeUnsupported`) is replayed at
every point, and so is a point beyond float64's exact range or where a size with a fraction is not whole;
:data:`STATS` counts each way.
"""

from __future__ import annotations

import gc
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Any

import numpy as np

from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.step import (
    PHASES,
    PhasePeak,
    StepOptions,
    StepResult,
    TrainingHooks,
    run_step,
    simulate_step,
)
from gpumem_gui.core.replay.sym import TapeUnsupported
from gpumem_gui.core.replay.tape import Tape, TapeCache, TapeSim, record
from gpumem_gui.core.spec.model import ModelSpec

# the step's byte counts, kept as polynomials (every field of StepResult that is a whole number)
_COUNTS = tuple(f.name for f in fields(StepResult) if f.type == "int")
# a step's tape holds ~12 bytes per monomial and event: 0.5 MiB for Llama-3.1-8B's full step, 4.4 MiB for
# Llama-3.1-405B's with LoRA and checkpointing (definition: 16 shapes, 8 structures each: torchtune's chunked
# loss splits the tokens 8 ways, one tape per remainder)
_TAPES = TapeCache(keys=16, per_key=8)
_UNSUPPORTED: OrderedDict[Any, str] = OrderedDict()  # shapes replayed at every point, with the reason
_UNSUPPORTED_KEPT = 256  # definition
STATS: Counter[str] = Counter()  # evaluated, recorded, replayed (first points), unsupported, inexact
TAPES_ON = True  # tests turn it off to compare with the replay
# the first points of a shape are replayed: recording costs about 2.5 replays (Llama-3.1-8B, 2 shared CPUs:
# benchmarks/bench_training.py), so a tape pays from the fourth point on (a sweep, a slider, a fit's search),
# and a shape asked once or twice (the fit's other changes, each a shape of its own) never records one
REPLAYED_FIRST = 2


def record_step(
    spec: ModelSpec,
    cfg: ReplayConfig,
    optimizer: str,
    opts: StepOptions,
    hooks: Callable[[], TrainingHooks],
    stream: bool = False,
    sim: type[TapeSim] = TapeSim,
) -> Tape:
    """The step of ``spec`` under ``cfg`` recorded at ``cfg``'s point (``extra``: the whole-parameter state
    owner, the same at every point; ``stream``: with the allocator's event stream, :meth:`Tape.events`;
    ``sim``: the runtime it records on, :class:`~.tape_period.MarkedSim` to find its repeated layers);
    raises :class:`TapeUnsupported`."""
    owner: list[tuple[int, int, int] | None] = []

    def run(sim: TapeSim, b: Any, q: Any, p: Any) -> dict[str, Any]:
        res = run_step(sim, spec, replace(cfg, batch=b, q=q), optimizer, opts)
        owner.append(res.state_owner)
        return {name: getattr(res, name) for name in _COUNTS}

    was_enabled = gc.isenabled()
    gc.disable()  # as simulate_step: storages die by reference counting only
    try:
        point = (cfg.batch, cfg.q, 0)
        tape = record(run, point, lambda: sim(hooks(), grad=True), phases=True, stream=stream)
    finally:
        if was_enabled:
            gc.enable()
    tape.extra = owner[0]
    return tape


def evaluate_step(tape: Tape, m: np.ndarray, stream: bool = False) -> StepResult:
    """The step's result at the point of monomials ``m`` (raises :class:`TapeUnsupported` beyond float64's
    exact range); ``stream``: with the allocator's event stream in ``events``, as
    :func:`~.step.simulate_step` ``record=True`` gives it (storage ordinals for identities)."""
    phases = {
        name: PhasePeak(total=pk.total, by_kind=pk.by_kind, by_tag=pk.by_tag, where=pk.where)
        for name, pk in tape.phase_peaks(m, PHASES).items()
    }
    events = tuple(tape.events(m)) if stream else None
    return StepResult(phases=phases, state_owner=tape.extra, events=events, **tape.exact_values(m))  # type: ignore[arg-type]


def simulate_step_taped(
    key: Any,
    spec: ModelSpec,
    cfg: ReplayConfig,
    optimizer: str,
    opts: StepOptions,
    hooks: Callable[[], TrainingHooks],
    stream: bool = False,
) -> StepResult:
    """:func:`~.step.simulate_step` of ``spec`` under ``cfg`` from the tape of ``key`` (everything the step
    depends on but ``cfg.batch`` and ``cfg.q``), recorded on the key's third point, with its stream;
    ``stream``: the result with the allocator's event stream (``simulate_step``'s ``record``)."""
    point = (cfg.batch, cfg.q, 0)
    replay = (spec, cfg, optimizer, opts, hooks, stream)
    if not TAPES_ON or key in _UNSUPPORTED:
        return _replay(*replay, "unsupported")
    found = _TAPES.find(key, point)
    if found is None and not _worth_recording(key):
        _TAPES.count(key, "replayed", 1)
        return _replay(*replay, "replayed")
    if found is None:
        try:
            tape = record_step(spec, cfg, optimizer, opts, hooks, True)  # with its stream: for either kind
        except TapeUnsupported as e:
            _UNSUPPORTED[key] = str(e)
            if len(_UNSUPPORTED) > _UNSUPPORTED_KEPT:
                _UNSUPPORTED.popitem(last=False)
            return _replay(*replay, "unsupported")
        _TAPES.add(key, tape)
        _TAPES.count(key, "recorded", 1)
        STATS["recorded"] += 1
        found = (tape, tape.monomials(point))
    tape, m = found
    try:
        res = evaluate_step(tape, m, stream)
    except TapeUnsupported:
        return _replay(*replay, "inexact")
    _TAPES.count(key, "evaluated", 1)
    STATS["evaluated"] += 1
    return res


class _Many(threading.local):
    """Whether this thread's caller asks many points of one shape next (:func:`many_points`)."""

    def __init__(self) -> None:
        self.on = False


_MANY = _Many()


@contextmanager
def many_points() -> Iterator[None]:
    """Within: a shape without a tape records one at its first point instead of replaying ``REPLAYED_FIRST``
    points first, for a caller about to ask many points of one shape that its guards will mostly admit (a
    search or a sweep over the sequence length at one micro-batch: they would record on their third point
    anyway); the answers are the same either way, only their cost moves."""
    was = _MANY.on
    _MANY.on = True
    try:
        yield
    finally:
        _MANY.on = was


def _worth_recording(key: Any) -> bool:
    """Record a tape for a point no tape of ``key`` admits? After ``REPLAYED_FIRST`` replayed points of a new
    shape (at once within :func:`many_points`); for a shape with tapes, unless its tapes served fewer than
    two points each (a guard that moves with every point asked: a linear-attention model's chunk count over
    a coarse sweep, where recording each point would cost more than replaying it)."""
    if not _TAPES.find_any(key):
        return _MANY.on or _TAPES.count(key, "replayed") >= REPLAYED_FIRST
    recorded = _TAPES.count(key, "recorded")
    return recorded < 2 or _TAPES.count(key, "evaluated") >= 2 * recorded


def _replay(
    spec: ModelSpec,
    cfg: ReplayConfig,
    optimizer: str,
    opts: StepOptions,
    hooks: Callable[[], TrainingHooks],
    stream: bool,
    why: str,
) -> StepResult:
    STATS[why] += 1
    return simulate_step(spec, cfg, optimizer, opts, hooks(), record=stream)


def unsupported() -> dict[Any, str]:
    """The structures replayed at every point, with the reason."""
    return dict(_UNSUPPORTED)


def clear() -> None:
    """Forget every tape (benchmarks measure a first point)."""
    _TAPES.clear()
    _UNSUPPORTED.clear()
