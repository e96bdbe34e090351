"""Issue 31 item 1: the step's tape carries storage identity (core/replay/tape_stream.py). The allocator's
event stream read off a tape recorded at one point equals, at every other point its guards admit, the
stream a full replay logs there (replay/memory.py ``Tracker.alloc_log`` after allocator/events.py
``normalize``): the same operations, the same storages, the same sizes, to the byte. Training (one GPU,
FSDP2, ZeRO-3, LoRA + checkpointing) and the inference forward."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpumem_gui.core.allocator import ALLOC, FREE, GROW, PHASE
from gpumem_gui.core.allocator.events import STREAM, normalize
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay import forward, step_tape
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.step import simulate_step
from gpumem_gui.core.training import make_training_run, rank
from gpumem_gui.core.training.rank import sharding_hooks, simulate, simulate_rank, step_config, step_options
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
LLAMA = "synthetic__smollm3-tiny"
RECORD_AT = (2, 64)
POINTS = ((1, 96), (3, 40), (2, 130), (4, 64))
LAYOUTS = {
    "one GPU": {},
    "FSDP2": {"fsdp": "full_shard", "dp": 4, "precision": "mp-bf16"},
    "ZeRO-3": {"zero": 3, "dp": 8},
    "LoRA + ckpt": {"method": "lora", "grad_ckpt": True, "grad_accum": 2},
}


def _spec():  # type: ignore[no-untyped-def]
    return spec_from_config(json.loads((CONFIGS / f"{LLAMA}.json").read_text()), name=LLAMA)


def _replayed_stream(run) -> list:  # type: ignore[no-untyped-def, type-arg]
    cfg, rspec = step_config(_spec(), run, 0)
    res = simulate_step(rspec, cfg, run.optimizer, step_options(run), sharding_hooks(run), record=True)
    assert res.events is not None
    return normalize(res.events)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_tapes_stream_is_the_replays_at_every_admitted_point(layout: str) -> None:
    fields = LAYOUTS[layout]
    run0 = make_training_run(batch=RECORD_AT[0], seq=RECORD_AT[1], **fields)  # type: ignore[arg-type]
    cfg0, rspec = step_config(_spec(), run0, 0)
    tape = step_tape.record_step(
        rspec, cfg0, run0.optimizer, step_options(run0), lambda: sharding_hooks(run0), stream=True
    )
    assert tape.stream is not None and len(tape.stream) > 100
    admitted = 0
    for batch, seq in (RECORD_AT, *POINTS):
        run = run0.model_copy(update={"batch": batch, "seq": seq})
        cfg, _ = step_config(_spec(), run, 0)
        point = (cfg.batch, cfg.q, 0)
        m = tape.monomials(point)
        if not tape.admits(m, point):
            continue
        admitted += 1
        got = tape.events(m)
        want = _replayed_stream(run)
        assert len(got) == len(want), (batch, seq)
        assert got == want, (batch, seq)
        assert {ALLOC, FREE, PHASE} <= {op for op, _, _ in got}
        assert (STREAM in {op for op, _, _ in got}) == (layout == "FSDP2")  # its side streams' buffers
    assert admitted >= 3, f"{layout}: the tape admits {admitted} of the points"


def test_the_estimates_allocator_report_is_the_replays_from_the_tape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training estimate's allocator report at a point read off the tape is the one a full replay of
    that point gives (the step's tape, ``simulate``, against ``simulate_rank``)."""
    monkeypatch.setattr(step_tape, "REPLAYED_FIRST", 0)
    step_tape.clear()
    step_tape.STATS.clear()
    rank._simulate_cached.cache_clear()
    try:
        base = make_training_run(batch=2, seq=64, grad_ckpt=True, allocator_model=True)
        simulate(_spec(), base, 0)  # records the tape with its stream
        for batch, seq in POINTS:
            run = base.model_copy(update={"batch": batch, "seq": seq})
            taped = simulate(_spec(), run, 0)[0]
            replayed = simulate_rank(_spec(), run)[0]
            assert taped.allocator is not None and taped.allocator == replayed.allocator
            assert taped.phases == replayed.phases
        assert step_tape.STATS["evaluated"] >= 3
    finally:
        step_tape.clear()
        rank._simulate_cached.cache_clear()


@pytest.mark.parametrize("point", [(1, 32, 0), (2, 1, 40), (3, 17, 100)])
def test_the_forward_tapes_stream_is_the_replays(point: tuple[int, int, int]) -> None:
    """Inference: the forward's tape (replay/forward.py) recorded with its stream at one point gives the
    stream the replayed forward logs at another its guards admit."""
    spec = _spec()
    cfg0 = ReplayConfig(batch=2, q=24, past=0, param_dt="bf16", kv_bytes=2)
    tape = forward.record(
        lambda sim, b, q, p: forward._run(sim, spec, replace(cfg0, batch=b, q=q, past=p)),
        (cfg0.batch, cfg0.q, cfg0.past),
        stream=True,
    )
    m = tape.monomials(point)
    if not tape.admits(m, point):  # a decode step (one token) takes other branches: its own tape
        tape = forward.record(
            lambda sim, b, q, p: forward._run(sim, spec, replace(cfg0, batch=b, q=q, past=p)),
            point,
            stream=True,
        )
        m = tape.monomials(point)
    sim = Sim()
    sim.grad_enabled = False
    sim.tr.alloc_log = log = []
    forward._run(sim, spec, replace(cfg0, batch=point[0], q=point[1], past=point[2]))
    sim.tr.alloc_log = None
    got = tape.events(m)
    assert got == normalize(log)
    assert sum(n for op, _, n in got if op in (ALLOC, GROW)) > 0


def test_the_fits_searches_skip_the_allocator_only_where_the_verdict_is_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fit_training's searches answer a point that misses without any allocator reserve from the tape alone
    (fit/training.py ``_fits``); the maxima and the fewest GPUs are those of checking every point in full."""
    from gpumem_gui.core.fit import GpuTarget
    from gpumem_gui.core.fit import training as fit

    run = make_training_run(batch=2, seq=256, allocator_model=True, zero=3, dp=2)
    target = GpuTarget(name="small", capacity_bytes=3 << 30, count=2)
    answers: list[bool] = []
    misses = fit._misses_without_reserve
    monkeypatch.setattr(fit, "_misses_without_reserve", lambda *a: answers.append(misses(*a)) or answers[-1])
    pruned = fit.fit_training(_spec(), run, target, margin=0)
    assert True in answers and False in answers  # some points skipped the allocator, some ran it
    monkeypatch.setattr(fit, "_misses_without_reserve", lambda *a: False)
    full = fit.fit_training(_spec(), run, target, margin=0)
    assert (pruned.max_batch, pruned.max_context, pruned.fewest_gpus) == (
        full.max_batch,
        full.max_context,
        full.fewest_gpus,
    )
    assert pruned.max_batch is not None and pruned.max_batch > 2
