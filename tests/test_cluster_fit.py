"""Placement of a run's whole plan on a cluster's GPUs (gpumem_gui.core.fit.cluster): exact hand-built cases
and properties every placement keeps."""

from __future__ import annotations

import json
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core import (
    DEFAULT_MARGIN_BYTES,
    ClusterFit,
    ClusterGpu,
    GiB,
    GpumemInputError,
    PlacedRank,
    Placement,
    cluster_document,
    cluster_fit,
    cluster_summary,
    estimate_any,
    fmt_bytes,
    load_model,
    make_run,
    make_training_run,
)

M = DEFAULT_MARGIN_BYTES
SPEC = load_model("meta-llama/Llama-3.1-8B").spec
SMALL = load_model("meta-llama/Llama-3.2-1B").spec


def gpu(host: str, index: int, free: float, total: float = 80, mig: int | None = None) -> ClusterGpu:
    """A GPU with ``free`` and ``total`` GiB (a MIG instance when ``mig`` is its instance id)."""
    key = f"{host}/{index}" + ("" if mig is None else f":{mig}")
    return ClusterGpu(
        host=host,
        key=key,
        index=index,
        name="test GPU",
        total_bytes=int(total * GiB),
        free_bytes=int(free * GiB),
        mig_instance=mig is not None,
    )


def needs(spec, run, total: float = 80) -> list[int]:  # type: ignore[no-untyped-def]
    return [g.total_bytes for g in estimate_any(spec, run, int(total * GiB)).per_gpu]


def where(p: Placement) -> dict[int, str]:
    return {r.rank: r.key for r in p.gpus}


def test_a_single_host_wins_over_two() -> None:
    run = make_run(pp=2)  # about 8.4 GiB per stage
    gpus = [gpu("a", 0, 12), gpu("a", 1, 12), gpu("b", 0, 70), gpu("c", 0, 70)]
    cf = cluster_fit(SPEC, run, gpus)
    assert cf.fits and cf.ranks == 2 and cf.placement_count == 1
    assert cf.placements[0].hosts == ("a",)
    assert set(where(cf.placements[0]).values()) == {"a/0", "a/1"}
    assert [(h.host, h.gpus, h.gpus_for_one_rank) for h in cf.hosts] == [
        ("a", 2, 2),
        ("b", 1, 1),
        ("c", 1, 1),
    ]
    assert cluster_summary(cf) == "fits now on a GPUs 0,1"
    # without a/1 no host takes both stages: two hosts, the pair with the most headroom first
    cf = cluster_fit(SPEC, run, gpus[:1] + gpus[2:])
    assert cf.placement_count == 2
    assert [set(p.hosts) for p in cf.placements] == [{"b", "c"}, {"a", "b"}]


def test_more_headroom_ranks_first_on_each_hosts_freest_gpu() -> None:
    run = make_run()
    (need,) = needs(SPEC, run)
    gpus = [gpu("a", 0, 20), gpu("b", 0, 20), gpu("b", 1, 40), gpu("c", 0, 10)]
    cf = cluster_fit(SPEC, run, gpus)
    assert [p.hosts for p in cf.placements] == [("b",), ("a",)]
    best = cf.placements[0].gpus[0]
    assert (best.key, best.needed_bytes, best.free_bytes) == ("b/1", need, 40 * GiB)
    assert best.headroom_bytes == cf.placements[0].headroom_bytes == 40 * GiB - M - need
    assert cf.placements[0].headroom_bytes > cf.placements[1].headroom_bytes
    assert cluster_summary(cf) == "fits now on b GPU 1 (and 1 other placement)"


def test_a_tp_group_stays_on_one_host_unless_allowed() -> None:
    run = make_run(tp=2)
    gpus = [gpu("a", 0, 20), gpu("b", 0, 20)]
    cf = cluster_fit(SPEC, run, gpus)
    assert not cf.fits and cf.tp == 2 and not cf.placements and cf.placement_count == 0
    assert cf.reason == "each TP group needs 2 GPUs on one host; the best host (a) can take 0 of 1 group"
    assert cluster_summary(cf) == f"does not fit anywhere now: {cf.reason}"
    across = cluster_fit(SPEC, run, gpus, tp_across_hosts=True)
    assert across.fits and across.tp_across_hosts and across.placement_count == 1
    assert where(across.placements[0]) == {0: "a/0", 1: "b/0"}
    assert cluster_summary(across) == "fits now on a GPU 0 + b GPU 0"
    # tp 2 x pp 2: two groups, each whole on its own host; c's single GPU cannot take a group
    cf = cluster_fit(
        SPEC, make_run(tp=2, pp=2), [*(gpu(h, i, 30) for h in "ab" for i in (0, 1)), gpu("c", 0, 70)]
    )
    assert cf.fits and cf.ranks == 4 and cf.placement_count == 1
    p = where(cf.placements[0])
    assert {p[0][0], p[1][0]} != {p[2][0], p[3][0]} and p[0][0] == p[1][0] and p[2][0] == p[3][0]


def test_mig_instances_take_one_rank_plans_only() -> None:
    gpus = [gpu("n", 0, 30, total=40, mig=1), gpu("n", 0, 30, total=40, mig=2)]
    cf = cluster_fit(SPEC, make_run(), gpus)
    assert cf.fits and cf.placement_count == 1
    assert cluster_summary(cf) == "fits now on n GPU 0 MIG 1"
    two = cluster_fit(SPEC, make_run(tp=2), gpus)
    assert (
        not two.fits and two.reason == "the plan needs 2 GPUs, and a MIG instance takes only one-rank plans"
    )
    assert [(h.gpus, h.gpus_for_one_rank) for h in two.hosts] == [(2, 0)]
    # a whole GPU next to them takes a rank, the MIG instances still do not
    two = cluster_fit(SPEC, make_run(tp=2), [*gpus, gpu("n", 1, 30)])
    assert two.reason == "the plan needs 2 GPUs; 1 has room"


def test_vllm_needs_its_whole_budget_of_each_gpus_total() -> None:
    run = make_run(engine="vllm", gpu_memory_utilization=0.5)
    gpus = [gpu("a", 0, 42, total=80), gpu("b", 0, 42, total=160)]  # budgets: 40 GiB and 80 GiB
    cf = cluster_fit(SPEC, run, gpus)
    assert cf.placement_count == 1 and cf.placements[0].hosts == ("a",)
    assert cf.placements[0].gpus[0].needed_bytes == 40 * GiB
    assert [h.gpus_for_one_rank for h in cf.hosts] == [1, 0]
    # on a 16 GiB GPU the 90 % budget leaves no KV pages after the weights: vLLM would not start
    small = cluster_fit(SPEC, make_run(engine="vllm"), [gpu("s", 0, 16, total=16)])
    assert small.reason == "vLLM would not start the run on these GPUs (KV pool too small)"


def test_training_places_every_data_parallel_replica() -> None:
    run = make_training_run(dp=2, tp=2, zero=1)
    need = needs(SMALL, run)
    assert len(need) == 2  # the estimate's per_gpu holds one replica
    gpus = [gpu(h, i, 16) for h in "ab" for i in (0, 1)]
    cf = cluster_fit(SMALL, run, gpus)
    assert cf.fits and cf.ranks == 4 and cf.tp == 2 and cf.placement_count == 1
    p = cf.placements[0]
    assert where(p) == {0: "a/0", 1: "a/1", 2: "b/0", 3: "b/1"}
    assert [r.needed_bytes for r in p.gpus] == need * 2
    assert cluster_summary(cf) == "fits now on a GPUs 0,1 + b GPUs 0,1"
    one = cluster_fit(SMALL, run, [gpu("big", i, 16) for i in range(4)])
    assert one.placements[0].hosts == ("big",) and cluster_summary(one) == "fits now on big GPUs 0-3"


def test_reasons_when_nothing_fits() -> None:
    run = make_run()
    (need,) = needs(SPEC, run)
    none = cluster_fit(SPEC, run, [])
    assert not none.fits and none.reason == "no usable GPU (all stale or lost)" and none.hosts == ()
    cf = cluster_fit(SPEC, run, [gpu("a", 0, 10), gpu("c", 3, 12)])
    assert (
        cf.reason
        == f"no GPU has {fmt_bytes(need + M)} free for one rank (the freest: c GPU 3 with 12.00 GiB)"
    )
    cf = cluster_fit(SPEC, make_run(pp=4), [gpu("a", i, 20) for i in range(3)] + [gpu("b", 0, 2)])
    assert cf.reason == "the plan needs 4 GPUs; 3 have room"
    assert cluster_summary(cf) == "does not fit anywhere now: the plan needs 4 GPUs; 3 have room"


def test_limit_keeps_the_best_and_counts_all() -> None:
    gpus = [gpu(f"h{i}", 0, 20 + i) for i in range(5)]
    cf = cluster_fit(SPEC, make_run(), gpus, limit=2)
    assert cf.placement_count == 5 and [p.hosts for p in cf.placements] == [("h4",), ("h3",)]
    assert cluster_summary(cf) == "fits now on h4 GPU 0 (and 4 other placements)"


def test_rejected_input_raises() -> None:
    with pytest.raises(GpumemInputError):
        cluster_fit(SPEC, make_run(tp=3), [gpu("a", 0, 70)])  # 3 does not divide 32 heads
    with pytest.raises(GpumemInputError):
        cluster_fit(SMALL, make_training_run(tp=3), [gpu("a", 0, 70)])
    with pytest.raises(GpumemInputError, match="appears twice"):
        cluster_fit(SPEC, make_run(), [gpu("a", 0, 70), gpu("a", 0, 70)])
    with pytest.raises(GpumemInputError, match="margin"):
        cluster_fit(SPEC, make_run(), [gpu("a", 0, 70)], margin=-1)
    with pytest.raises(GpumemInputError, match="limit"):
        cluster_fit(SPEC, make_run(), [gpu("a", 0, 70)], limit=0)


def test_document_keys() -> None:
    cf = cluster_fit(SPEC, make_run(tp=2), [gpu("a", 0, 30), gpu("a", 1, 30)])
    doc = cluster_document(cf)
    json.dumps(doc)
    assert list(doc) == [
        "fits", "summary", "ranks", "tp", "tp_across_hosts", "margin_bytes", "placement_count", "placements",
        "hosts", "reason",
    ]  # fmt: skip
    assert doc["summary"] == cluster_summary(cf) == "fits now on a GPUs 0,1"
    (p,) = doc["placements"]
    assert list(p) == ["hosts", "headroom_bytes", "gpus"] and p["hosts"] == ["a"]
    assert list(p["gpus"][0]) == [
        "rank", "host", "index", "key", "needed_bytes", "free_bytes", "headroom_bytes",
    ]  # fmt: skip
    assert doc["hosts"] == [{"host": "a", "gpus": 2, "gpus_for_one_rank": 2}]
    assert doc["reason"] is None and doc["margin_bytes"] == M and doc["tp"] == 2


def _fit(spots: list[tuple[str, int]], count: int = 1) -> ClusterFit:
    ranks = tuple(
        PlacedRank(rank=r, host=h, index=i, key=f"{h}/{i}", needed_bytes=1, free_bytes=2, headroom_bytes=1)
        for r, (h, i) in enumerate(spots)
    )
    hosts = tuple(dict.fromkeys(h for h, _i in spots))
    p = Placement(hosts=hosts, gpus=ranks, headroom_bytes=1)
    return ClusterFit(
        ranks=len(spots), tp=1, tp_across_hosts=False, margin_bytes=0, fits=True, placements=(p,),
        placement_count=count, hosts=(),
    )  # fmt: skip


def test_summary_strings() -> None:
    assert cluster_summary(_fit([("node-a", 4), ("node-a", 6), ("node-b", 1)])) == (
        "fits now on node-a GPUs 4,6 + node-b GPU 1"
    )
    spots = [("node-a", i) for i in (0, 1, 2, 3, 5, 7)]
    assert cluster_summary(_fit(spots, 3)) == "fits now on node-a GPUs 0-3,5,7 (and 2 other placements)"
    assert cluster_summary(_fit([("n", 4), ("n", 5)], 2)) == "fits now on n GPUs 4,5 (and 1 other placement)"


# ---- properties ----------------------------------------------------------------------------------------

RUNS = {
    "tp1": (SPEC, make_run()),
    "tp2": (SPEC, make_run(tp=2)),
    "pp2": (SPEC, make_run(pp=2)),
    "tp2pp2": (SPEC, make_run(tp=2, pp=2)),
    "vllm-tp2": (SPEC, make_run(engine="vllm", tp=2, gpu_memory_utilization=0.3)),
    "train-dp2-tp2": (SMALL, make_training_run(dp=2, tp=2, zero=1)),
    "train-dp3-pp2": (SMALL, make_training_run(dp=3, pp=2, zero=3)),
}


@cache
def _needs(name: str, total: int) -> tuple[int, ...]:
    spec, run = RUNS[name]
    est = estimate_any(spec, run, total)
    return tuple(int(est.facts.get("budget_bytes", g.total_bytes)) for g in est.per_gpu)  # type: ignore[call-overload]


_GPU = st.tuples(st.integers(0, 100), st.sampled_from([40, 80]), st.integers(0, 9))
_CLUSTER = st.lists(st.lists(_GPU, min_size=1, max_size=6), min_size=0, max_size=5)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(RUNS)), _CLUSTER, st.booleans(), st.integers(1, 4))
def test_every_placement_is_sound(name: str, hosts: list, across: bool, limit: int) -> None:  # type: ignore[type-arg]
    spec, run = RUNS[name]
    gpus = []
    for h, host in enumerate(hosts):
        for i, (pct, total, mig) in enumerate(host):
            free = min(total * GiB, (max(_needs(name, total * GiB)) + M) * pct // 50)
            is_mig = mig == 0  # about one in ten is a MIG instance
            key = f"h{h}/{i}" + (":1" if is_mig else "")
            gpus.append(
                ClusterGpu(host=f"h{h}", key=key, index=i, name="g", total_bytes=total * GiB, free_bytes=free,
                           mig_instance=is_mig)
            )  # fmt: skip
    cf = cluster_fit(spec, run, gpus, tp_across_hosts=across, limit=limit)
    by_key = {g.key: g for g in gpus}
    assert cf.fits == bool(cf.placements) == (cf.reason is None)
    assert len(cf.placements) <= limit and cf.placement_count >= len(cf.placements)
    assert [h.host for h in cf.hosts] == list(dict.fromkeys(g.host for g in gpus))
    order = [(len(p.hosts), -p.headroom_bytes) for p in cf.placements]
    assert order == sorted(order)
    assert len({frozenset(p.hosts) for p in cf.placements}) == len(cf.placements)
    for p in cf.placements:
        assert [r.rank for r in p.gpus] == list(range(cf.ranks))
        assert len({r.key for r in p.gpus}) == cf.ranks
        assert p.hosts == tuple(dict.fromkeys(r.host for r in p.gpus))
        assert p.headroom_bytes == min(r.headroom_bytes for r in p.gpus)
        for r in p.gpus:
            g = by_key[r.key]
            assert (g.host, g.index, g.free_bytes) == (r.host, r.index, r.free_bytes)
            per = _needs(name, g.total_bytes)
            assert r.needed_bytes == per[r.rank % len(per)]
            assert r.headroom_bytes == g.free_bytes - M - r.needed_bytes >= 0
            assert not g.mig_instance or cf.ranks == 1
        if not across:
            for first in range(0, cf.ranks, cf.tp):
                assert len({r.host for r in p.gpus[first : first + cf.tp]}) == 1


def test_a_saved_calibration_applies_to_the_gpus_of_its_model_only() -> None:
    """The plan's need on each GPU is the estimate a single --gpu of that model gives, calibration included
    (core/observed/apply.py); GPUs of another model keep the plain estimate; the fit names what it applied."""
    from datetime import date

    from gpumem_gui.core import apply_calibration, calibration_from
    from gpumem_gui.core.observed import ObservedMemory

    # a measurement whose non-PyTorch memory (3 GiB) is far above the modelled context + workspaces
    oom = ObservedMemory(source_format="torch_oom", total_bytes=80 * GiB, process_bytes=60 * GiB,
                         allocated_bytes=55 * GiB, reserved_unallocated_bytes=2 * GiB)  # fmt: skip
    cal = calibration_from((oom,), None, name="h100-team", gpu_name="test GPU", measured_on=date(2026, 12, 7))
    other = gpu("b", 0, 70).model_copy(update={"name": "other GPU"})
    run = make_run(seq=8192)
    cf = cluster_fit(SPEC, run, [gpu("a", 0, 70), other], calibrations=(cal,))
    plain = estimate_any(SPEC, run, 80 * GiB)
    by_key = {r.key: r.needed_bytes for p in cf.placements for r in p.gpus}
    assert by_key["a/0"] == apply_calibration(plain, cal).per_gpu[0].total_bytes
    assert by_key["b/0"] == plain.per_gpu[0].total_bytes < by_key["a/0"]
    assert cf.calibrations == ("h100-team",) and cluster_document(cf)["calibrations"] == ["h100-team"]
    bare = cluster_fit(SPEC, run, [gpu("a", 0, 70), other])
    assert bare.calibrations == () and "calibrations" not in cluster_document(bare)
    assert {r.needed_bytes for p in bare.placements for r in p.gpus} == {plain.per_gpu[0].total_bytes}
