"""Layer repetition in a recorded step (replay/tape_period.py): which layers' segments repeat, that a tape
spliced from one segment is the full recording's to the byte, and that layers which differ end a run."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.bench_training import TRAIN_EXAMPLES
from gpumem_gui.core import load_model
from gpumem_gui.core.replay import tape_period as tp
from gpumem_gui.core.replay.step import PHASES
from gpumem_gui.core.replay.step_tape import record_step
from gpumem_gui.core.replay.tape_phases import PhaseTable
from gpumem_gui.core.training import make_training_run
from gpumem_gui.core.training.rank import sharding_hooks, step_config, step_options

LLAMA = "meta-llama/Llama-3.1-8B"


def _recorded(model: str, stage: int = 0, seq: int = 512, **fields: Any) -> tuple[Any, Any, dict[str, int]]:
    """A step's tape recorded on a marked tracker at batch 1: the tape, what its tracker kept (events,
    marks, guards, congruences) and where each tag first appeared."""
    spec = load_model(model).spec
    run = make_training_run(batch=1, seq=seq, **fields)
    cfg, rspec = step_config(spec, run, stage, run)
    trackers: list[tp.MarkedTracker] = []

    class Sim(tp.MarkedSim):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            trackers.append(self.tr)  # type: ignore[arg-type]

    tape = record_step(rspec, cfg, run.optimizer, step_options(run), lambda: sharding_hooks(run), sim=Sim)
    return tape, trackers[0].kept, trackers[0].kept_seen


def _periods(kept: Any) -> dict[str, list[tuple[int, ...]]]:
    events, marks, guards, congruences = kept
    out: dict[str, list[tuple[int, ...]]] = {}
    for p in tp.layer_periods(events, marks, guards, congruences):
        out.setdefault(p.phase, []).append(p.layers)
    return out


class _Log:
    """What a :class:`PhaseTable` reads of a tracker."""

    def __init__(self, events: list[Any], seen: dict[str, int]) -> None:
        self.events = events
        self.seen = seen


def _shifted(seen: dict[str, int], period: tp.Period) -> dict[str, int]:
    """``seen`` of a tape with one segment of ``period`` fewer."""
    first = period.segments[0]
    n = first.end - first.start
    return {t: k if k < first.end else k - n for t, k in seen.items()}


def _peaks(table: PhaseTable, tape: Any, points: list[tuple[int, int]]) -> list[Any]:
    return [table.peaks(tape.monomials((b, q, 0)), PHASES) for b, q in points]


def test_llama_full_middle_layers_repeat_and_a_spliced_tape_is_the_recording() -> None:
    tape, kept, seen = _recorded(LLAMA, method="full")
    periods = _periods(kept)
    # every forward layer alike; in the backward all but layer 0 (no gradient for the embedding's output)
    assert periods["forward"] == [tuple(range(32))]
    assert periods["backward"] == [tuple(range(31, 0, -1))]
    events = kept[0]
    spliced = events
    for p in tp.layer_periods(*kept):
        # the run cut to its first two segments (what a shorter replay records), then spliced back
        cut = tp.splice(spliced, p, 2)
        (again,) = [q for q in tp.layer_periods(cut) if q.phase == p.phase]
        assert again.layers == p.layers[:2]
        spliced = tp.splice(cut, again, len(p.segments))
    assert [(*tp._event_key(e), e[4]) for e in spliced] == [(*tp._event_key(e), e[4]) for e in events]
    full = PhaseTable(_Log(events, seen), tape.mono_exps)  # type: ignore[arg-type]
    ours = PhaseTable(_Log(spliced, seen), tape.mono_exps)  # type: ignore[arg-type]
    points = [(1, 512), (2, 4096), (3, 777), (8, 16384)]
    assert _peaks(ours, tape, points) == _peaks(full, tape, points)
    # and the same as the tape's own peaks
    assert _peaks(full, tape, points) == [
        tape.phase_peaks(tape.monomials((b, q, 0)), PHASES) for b, q in points
    ]


def test_spliced_with_fewer_layers_moves_the_peaks() -> None:
    """The comparison can fail: a splice with one copy too few is not the recording."""
    tape, kept, seen = _recorded(LLAMA, method="full")
    events = kept[0]
    (fwd,) = [p for p in tp.layer_periods(*kept) if p.phase == "forward"]
    short = tp.splice(events, fwd, len(fwd.segments) - 1)
    full = PhaseTable(_Log(events, seen), tape.mono_exps)  # type: ignore[arg-type]
    ours = PhaseTable(_Log(short, _shifted(seen, fwd)), tape.mono_exps)  # type: ignore[arg-type]
    assert _peaks(ours, tape, [(1, 512)]) != _peaks(full, tape, [(1, 512)])


@pytest.mark.parametrize(
    ("fields", "stage", "forward", "backward"),
    [
        # LoRA + checkpointing: the same as the full step
        (TRAIN_EXAMPLES["LoRA + ckpt"], 0, [tuple(range(32))], [tuple(range(31, 0, -1))]),
        # ZeRO-3 (DeepSpeed): its prefetch differs at the last two layers and the first
        (TRAIN_EXAMPLES["ZeRO-3 dp8"], 0, [tuple(range(1, 30))], [tuple(range(31, 0, -1))]),
        # FSDP2: the last unit is not resharded after the forward, and the first two layers' backward differ
        ({"fsdp": "full_shard", "dp": 8}, 0, [tuple(range(31))], [tuple(range(30, 1, -1))]),
        # torchtitan's second pipeline stage: two micro-batches, each phase visited twice (a run per visit;
        # its phase entry keeps the last layer's place but is no part of it); the first micro-batch's last
        # unit stays gathered, and layer 0 of each backward differs
        (
            TRAIN_EXAMPLES["torchtitan FSDP2 x TP2 + SP x PP2"],
            1,
            [tuple(range(15)), tuple(range(16))],
            [tuple(range(14, 0, -1))] * 2,
        ),
    ],
)
def test_boundary_layers_end_the_run(
    fields: dict[str, Any], stage: int, forward: list[Any], backward: list[Any]
) -> None:
    _, kept, _ = _recorded(LLAMA, stage, **fields)
    periods = _periods(kept)
    assert periods["forward"] == forward
    assert periods["backward"] == backward


def test_layers_of_two_kinds_never_repeat_one_layer() -> None:
    """Gemma 2 alternates sliding-window (4,096) and full attention: past the window under SDPA no two
    consecutive layers are alike, so no period of one layer is proven and the whole step must be replayed;
    within the window (or under eager attention, which computes every score and masks) they are alike."""
    _, kept, _ = _recorded("google/gemma-2-2b", seq=8192, method="full")
    assert _periods(kept) == {}
    _, kept, _ = _recorded("google/gemma-2-2b", seq=512, method="full")
    assert _periods(kept) == {"forward": [tuple(range(26))], "backward": [tuple(range(25, 0, -1))]}


def test_a_guard_that_differs_ends_the_run() -> None:
    """Two segments of equal events but different guards are not one repeated (synthetic events)."""
    ev = [(1, 8, "act", "x", f"layer {i} MLP", "forward", True) for i in range(4)]
    ev += [(-1, 8, "act", "x", f"layer {i} MLP", "forward", False) for i in range(4)]
    ev.sort(key=lambda e: e[4])
    marks = [(k // 2, 0) for k in range(len(ev))]  # one guard recorded per layer
    same = [({(0, 1, 0): 1}, ">", True)] * 4
    other = [*same[:2], ({(0, 1, 0): 1}, "<", False), same[3]]
    assert [p.layers for p in tp.layer_periods(ev, marks, same, [])] == [(0, 1, 2, 3)]
    assert [p.layers for p in tp.layer_periods(ev, marks, other, [])] == [(0, 1)]
    assert [p.layers for p in tp.layer_periods(ev)] == [(0, 1, 2, 3)]  # the events alone are alike
