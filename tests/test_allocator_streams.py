"""Issue 31 item 1: the allocator model's streams. PyTorch's caching allocator keeps a block freed on one CUDA
stream for that stream's allocations only (c10/cuda/CUDACachingAllocator.cpp ``get_free_block``: the pool's
blocks are ordered by (stream, size, address) and the best fit is refused when ``(*it)->stream !=
p.stream()``). The replay says which stream allocates with STREAM events (core/allocator/events.py); FSDP2
makes its flat all-gather buffers on the all-gather copy-in stream and its reduce-scatter output on the
reduce-scatter stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_all_gather``,
``foreach_reduce``), so their cached blocks never serve the default stream's activations."""

from __future__ import annotations

import json
from functools import cache

from gpumem_gui.core import estimate_training, load_model
from gpumem_gui.core.allocator import ALLOC, FREE, PHASE, run_events
from gpumem_gui.core.allocator.events import STREAM, Event, normalize
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.step import simulate_step
from gpumem_gui.core.results.reported import reserved_prediction
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import make_training_run
from gpumem_gui.core.training.fsdp2 import AG_COPY_IN_STREAM, RS_STREAM, Fsdp2Hooks
from gpumem_gui.core.training.rank import sharding_hooks, step_config, step_options
from tests.conftest import REPO

MiB, GiB = 1 << 20, 1 << 30
CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _no_streams(events: list[Event]) -> list[Event]:
    return [e for e in events if e[0] != STREAM]


def test_a_block_freed_on_a_side_stream_serves_only_that_stream() -> None:
    """100 MiB made and freed on stream 1, then on the default stream, twice: the default stream cannot take
    stream 1's cached block (a second cudaMalloc), and each stream's next 100 MiB takes its own (no third).
    On one stream the one block serves all four."""
    ev: list[Event] = [(PHASE, "forward", 0)]
    for key, stream in enumerate((1, 0, 1, 0)):
        ev += [(STREAM, stream, 0), (ALLOC, key, 100 * MiB), (FREE, key, 100 * MiB)]
    apart, together = run_events(ev, steps=1), run_events(_no_streams(ev), steps=1)
    assert (apart.reserved_peak, apart.device_allocs) == (200 * MiB, 2)
    assert (together.reserved_peak, together.device_allocs) == (100 * MiB, 1)
    assert apart.live_peak == together.live_peak == 100 * MiB
    assert apart.reserved_end == 200 * MiB and apart.largest_free_block == 100 * MiB


def test_a_repeated_step_starts_on_the_stream_the_first_started_on() -> None:
    """A step that ends on stream 1: the next step's first allocation (100 MiB) is the default stream's
    again and reuses its own cached block (steady state: no new cudaMalloc); on stream 1 it would find
    only a 50 MiB block there."""
    ev: list[Event] = [
        (PHASE, "forward", 0),
        (ALLOC, 1, 100 * MiB),
        (FREE, 1, 100 * MiB),
        (STREAM, 1, 0),
        (ALLOC, 2, 50 * MiB),
        (FREE, 2, 50 * MiB),
    ]
    one, two = run_events(ev, steps=1), run_events(ev, steps=2)
    assert (one.reserved_peak, one.device_allocs) == (150 * MiB, 2)
    assert (two.reserved_peak, two.device_allocs) == (150 * MiB, 2)


def test_the_setup_keeps_the_stream_each_storage_was_made_on() -> None:
    """A storage the setup made on stream 1, freed in the step: the default stream cannot reuse it."""
    ev: list[Event] = [
        (STREAM, 1, 0),
        (ALLOC, 1, 100 * MiB),
        (STREAM, 0, 0),
        (ALLOC, 2, 30 * MiB),
        (PHASE, "forward", 0),
        (FREE, 1, 100 * MiB),
        (ALLOC, 3, 100 * MiB),
    ]
    rep = run_events(ev, steps=1)
    assert rep.reserved_peak == 230 * MiB
    assert run_events(_no_streams(ev), steps=1).reserved_peak == 130 * MiB


def test_the_default_stream_alone_is_the_report_without_streams() -> None:
    """Every event on the default stream, said or not: the same report, to the byte."""
    ev: list[Event] = [
        (ALLOC, 1, 10 * MiB),
        (PHASE, "forward", 0),
        (ALLOC, 2, 300 * MiB),
        (ALLOC, 3, 3 * MiB),
        (FREE, 2, 300 * MiB),
        (PHASE, "backward", 0),
        (ALLOC, 4, 120 * MiB),
        (FREE, 3, 3 * MiB),
        (FREE, 4, 120 * MiB),
    ]
    said = [(STREAM, 0, 0), *ev[:3], (STREAM, 0, 0), *ev[3:]]
    for steps in (1, 2):
        assert run_events(said, steps=steps) == run_events(ev, steps=steps)


@cache
def _tiny() -> ModelSpec:
    name = "synthetic__smollm3-tiny"
    return spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


def _events(**fields: object) -> tuple[list[Event], object]:
    run = make_training_run(batch=2, seq=64, **fields)  # type: ignore[arg-type]
    cfg, rspec = step_config(_tiny(), run, 0)
    hooks = sharding_hooks(run)
    res = simulate_step(rspec, cfg, run.optimizer, step_options(run), hooks, record=True)
    assert res.events is not None
    return normalize(res.events), hooks


def _sizes_by_stream(events: list[Event]) -> dict[object, list[int]]:
    stream: object = 0
    out: dict[object, list[int]] = {}
    for op, key, nbytes in events:
        if op == STREAM:
            stream = key
        elif op == ALLOC:
            out.setdefault(stream, []).append(nbytes)
    return out


def test_fsdp2_all_gather_and_reduce_scatter_buffers_are_on_their_streams() -> None:
    """FSDP2 with a bf16 param dtype: the all-gather copy-in stream makes each unit's flat input (its shards
    cast) and flat output (world x its shards), forward and backward; the reduce-scatter stream makes each
    unit's flat 1/world output; the reduce-scatter input (the unit's padded gradients) is made on the
    default stream (foreach_reduce allocates it before entering the reduce-scatter stream)."""
    events, hooks = _events(fsdp="full_shard", dp=4, precision="mp-bf16")
    assert isinstance(hooks, Fsdp2Hooks)
    units = hooks.units.values()
    by_stream = _sizes_by_stream(events)
    assert set(by_stream) == {0, AG_COPY_IN_STREAM, RS_STREAM}
    assert sorted(by_stream[AG_COPY_IN_STREAM]) == sorted(
        size for u in units for size in (u.shard_compute, u.full) for _ in range(2)
    )
    assert sorted(by_stream[RS_STREAM]) == sorted(u.rs // 4 for u in units if u.trainable)
    assert all(u.rs in by_stream[0] for u in units if u.trainable)
    # the streams move reserved memory only: the tensors, their peaks, are the same
    apart, together = run_events(events), run_events(_no_streams(events))
    assert apart.live_peak == together.live_peak and apart.allocated_peak == together.allocated_peak
    assert apart.reserved_peak > together.reserved_peak
    # one rank: no all-gather (PG unshard returns before foreach_all_gather), the cast made on the default
    # stream by wait_for_unshard; the reduce-scatter output is still made on its stream
    one, _ = _events(fsdp="full_shard", dp=1, precision="mp-bf16")
    assert set(_sizes_by_stream(one)) == {0, RS_STREAM}


def test_runs_without_fsdp2_allocate_on_the_default_stream_only() -> None:
    """One GPU, DDP, ZeRO-3 and FSDP1: no STREAM event, so the allocator's report is the one before
    streams."""
    for fields in ({}, {"dp": 2}, {"zero": 3, "dp": 8}, {"fsdp": "full_shard", "dp": 4, "fsdp_version": 1}):
        events, _ = _events(**fields)
        assert all(e[0] != STREAM for e in events), fields


def test_published_reserved_of_torchtitan_llama31_8b_fsdp8() -> None:
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1 (points.json titan-l31-8b-fsdp8 under
    validation/data/published_training_runs/): Llama 3.1 8B, FSDP2 on 8 H100s, mp bf16/fp32, local batch 2,
    seq 8192, selective op checkpointing, expandable segments (its launcher's PYTORCH_CUDA_ALLOC_CONF):
    82.4 GiB max reserved. With every allocation on one stream the allocator model said -11.6 % (-7.7 %
    without expandable segments): the all-gather pool (the root's 2 GB flat output, one layer's) and the
    reduce-scatter pool (the 1/8 fp32 gradient shards, cached from the last step) are kept apart from the
    default stream's (-4.4 % with them; the project's per-point threshold is 5 %)."""
    points = json.loads((REPO / "validation/data/published_training_runs/points.json").read_text())
    p = next(p for p in points["points"] if p["id"] == "titan-l31-8b-fsdp8")
    spec = load_model(p["model"]).spec
    assert spec is not None
    est = estimate_training(spec, make_training_run(**p["run"], allocator_model=True))
    assert p["run"]["alloc_conf"] == "expandable_segments:True"
    assert abs(reserved_prediction(est) / p["measured"]["bytes"] - 1) < 0.05
