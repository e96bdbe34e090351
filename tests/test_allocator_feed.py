"""The replay's allocation stream (replay/memory.py ``Tracker.alloc_log``) feeding the caching allocator model
(core/allocator/run.py), and its figure in the training estimate with --allocator-model (results/reserve.py;
off, the reserve stays the flat share and the step is read off its tape)."""

from __future__ import annotations

import json
from functools import cache

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import TrainingRun, estimate_training, load_model
from gpumem_gui.core.allocator import ALLOC, FREE, GROW, PHASE, AllocatorConfig, run_events
from gpumem_gui.core.replay.step import simulate_step
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import make_training_run
from gpumem_gui.core.training.rank import sharding_hooks, simulate_rank, step_config, step_options
from tests.conftest import REPO

MiB, GiB = 1 << 20, 1 << 30


@cache
def _spec(name: str = "Qwen/Qwen2.5-0.5B") -> ModelSpec:
    spec = load_model(name).spec
    assert spec is not None
    return spec


def _step(run: TrainingRun, record: bool):  # type: ignore[no-untyped-def]
    cfg, rspec = step_config(_spec(), run, 0)
    return simulate_step(rspec, cfg, run.optimizer, step_options(run), sharding_hooks(run), record=record)


def test_recording_is_off_by_default_and_changes_no_peak() -> None:
    run = TrainingRun(batch=2, seq=256, grad_ckpt=True)
    plain, recorded = _step(run, False), _step(run, True)
    assert plain.events is None and recorded.events
    assert {k: v.total for k, v in plain.phases.items()} == {k: v.total for k, v in recorded.phases.items()}


@pytest.mark.parametrize(
    "kw", [{}, {"grad_ckpt": True}, {"method": "lora", "grad_accum": 2}, {"zero": 3, "dp": 4}]
)
def test_the_stream_replays_the_trackers_live_bytes_exactly(kw: dict[str, object]) -> None:
    """Summing the events by phase gives the tracker's own phase peaks, to the byte: every allocation, growth
    and free is in the stream, in order, with its storage's identity."""
    res = _step(TrainingRun(batch=2, seq=256, **kw), True)  # type: ignore[arg-type]
    live, phase, peaks, alive = 0, "setup", {}, {}
    for op, key, nbytes in res.events:
        if op == PHASE:
            phase = key
        elif op == ALLOC:
            assert key not in alive  # an identity is not reused while its storage lives
            alive[key] = nbytes
            live += nbytes
        elif op == GROW:
            alive[key] += nbytes
            live += nbytes
        elif op == FREE:
            assert alive.pop(key) == nbytes
            live -= nbytes
        peaks[phase] = max(peaks.get(phase, live), live)
    for name, pk in res.phases.items():
        assert peaks[name] == pk.total, name


def test_the_report_sees_the_same_live_peak_as_the_estimate() -> None:
    run = TrainingRun(batch=2, seq=512, grad_ckpt=True, allocator_model=True)
    res, _, _ = simulate_rank(_spec(), run)
    rep = res.allocator
    assert rep is not None and rep.steps == 2
    assert rep.live_peak == max(p.total for p in res.phases.values())
    assert rep.live_peak <= rep.allocated_peak <= rep.needed_peak <= rep.reserved_peak
    assert {p.name for p in rep.phases} >= {"forward", "backward", "optimizer"}


def test_a_repeated_step_keeps_what_the_first_left_alive_once() -> None:
    ev = [
        (ALLOC, 1, 100 * MiB),  # setup: weights
        (PHASE, "forward", 0),
        (ALLOC, 2, 50 * MiB),  # made in the step and kept (first-step optimizer states)
        (ALLOC, 3, 30 * MiB),
        (FREE, 3, 30 * MiB),
    ]
    one, two = run_events(ev, steps=1), run_events(ev, steps=2)
    assert one.live_peak == two.live_peak == 180 * MiB
    assert two.reserved_peak == 180 * MiB  # the second step's 30 MiB reuse the first's cached block


def test_growth_is_a_block_beside_the_storage_and_an_exact_shrink_frees_it() -> None:
    ev = [(PHASE, "forward", 0), (ALLOC, 1, 10 * MiB), (GROW, 1, 30 * MiB), (GROW, 1, -30 * MiB)]
    rep = run_events(ev, steps=1)
    assert (rep.live_peak, rep.allocated_peak, rep.allocated_end) == (40 * MiB, 40 * MiB, 10 * MiB)
    # a shrink that is not the last growth reallocates the storage at its new size
    ev2 = [(PHASE, "forward", 0), (ALLOC, 1, 40 * MiB), (GROW, 1, -10 * MiB)]
    rep2 = run_events(ev2, steps=1)
    assert (rep2.allocated_peak, rep2.allocated_end) == (70 * MiB, 30 * MiB)


def test_the_estimate_component_is_the_models_reserve() -> None:
    run = TrainingRun(batch=2, seq=512, grad_ckpt=True, allocator_model=True)
    est = estimate_training(_spec(), run)
    rep = simulate_rank(_spec(), run)[0].allocator
    assert rep is not None
    comp = est.component("allocator_reserve")
    assert comp is not None and comp.bytes == rep.needed_peak - rep.live_peak > 0
    assert comp.explain.inputs["reserved_peak_bytes"] == rep.reserved_peak
    assert "CUDACachingAllocator.cpp" in comp.explain.source
    assert est.facts["reserved_peak_bytes"] == rep.reserved_peak
    assert est.facts["allocator_needed_bytes"] == rep.needed_peak
    assert est.total_bytes == est.peak_bytes + sum(
        c.bytes for c in est.components if c.key in ("cuda_context", "workspace", "allocator_reserve")
    )
    flat = estimate_training(_spec(), run.model_copy(update={"allocator_model": False}))
    assert flat.peak_bytes == est.peak_bytes and "reserved_peak_bytes" not in flat.facts
    reserve = flat.component("allocator_reserve")
    assert reserve is not None and "5 %" in reserve.explain.formula


def test_alloc_conf_reaches_the_model() -> None:
    base = TrainingRun(batch=4, seq=1024, allocator_model=True)
    expandable = base.model_copy(update={"alloc_conf": "expandable_segments:True"})
    r0 = simulate_rank(_spec(), base)[0].allocator
    r1 = simulate_rank(_spec(), expandable)[0].allocator
    assert r0 is not None and r1 is not None
    assert r1.config == AllocatorConfig(expandable_segments=True)
    assert r1.live_peak == r0.live_peak and r1.reserved_peak != r0.reserved_peak


def test_bad_alloc_conf_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "Qwen/Qwen2.5-0.5B", "--mode", "train", "--allocator-model", "--alloc-conf"]
    args.append("max_split_size_mb:5")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "alloc_conf" in err and "max_split_size_mb" in err and "20" in err


def test_published_reserved_of_fsdp_qlora_llama2_7b_lora() -> None:
    """Answer.AI fsdp_qlora, benchmarks_03_2024.md (validation/data/published_training_runs/points.json
    aq-l2-7b-lora-2048): Llama-2-7B LoRA r64, FSDP1 on 2 GPUs, bf16, seq 2048, checkpointing: peak reserved
    10.22 GiB, peak allocated 9.16 GiB. The flat 5 % reserve put reserved at -6.6 %."""
    points = json.loads((REPO / "validation/data/published_training_runs/points.json").read_text())
    p = next(p for p in points["points"] if p["id"] == "aq-l2-7b-lora-2048")
    est = estimate_training(_spec(p["model"]), make_training_run(**p["run"], allocator_model=True))
    outside = sum(c.bytes for c in est.components if c.key in ("cuda_context", "nccl_buffers"))
    ours = est.total_bytes - outside  # reserved: everything but what lies outside the caching allocator
    assert abs(ours / p["measured"]["bytes"] - 1) < 0.03


def test_the_setup_is_taken_as_loaded() -> None:
    """Before the first phase the replay builds the model its own way (whole parameters, then their shard):
    the allocator is given what stands when the step begins, one block per storage at its final size."""
    ev = [
        (ALLOC, 1, 100 * MiB),  # a whole parameter ...
        (GROW, 1, -50 * MiB),  # ... sharded
        (ALLOC, 2, 30 * MiB),
        (FREE, 2, 30 * MiB),  # gone before the step
        (PHASE, "forward", 0),
        (ALLOC, 3, 5 * MiB),
    ]
    rep = run_events(ev, steps=1)
    assert rep.phase("setup") is not None
    assert rep.phase("setup").reserved_peak == 50 * MiB  # type: ignore[union-attr]
    assert (rep.live_peak, rep.reserved_peak) == (55 * MiB, 70 * MiB)  # the 5 MiB in a 20 MiB segment
