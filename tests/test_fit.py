"""Fit verdicts and solvers."""

from __future__ import annotations

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fit import GpuTarget, fit_report
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.units import GiB
from tests.conftest import reference_dir

SPEC = load_config_file(reference_dir() / "configs" / "meta-llama__Llama-3.1-8B.json")


def target(name: str = "RTX-4090", count: int = 1) -> GpuTarget:
    g = find_gpu(name)
    return GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=count)


def test_largest_bisects_monotone_predicates() -> None:
    calls: list[int] = []

    def pred(n: int) -> bool:
        calls.append(n)
        return n <= 777

    assert largest(pred, 1, 1 << 20) == 777
    assert len(calls) < 30
    assert largest(lambda n: False, 1, 10) is None
    assert largest(lambda n: True, 1, 10) == 10


def test_verdict_headroom_matches_the_estimate() -> None:
    run = make_run(seq=2048)
    rep = fit_report(SPEC, run, target("H100-SXM-80GB"))
    est = estimate_inference(SPEC, run)
    v = rep.verdicts[0]
    assert rep.fits and v.fits
    assert v.needed_bytes == est.total_bytes
    assert v.headroom_bytes == v.available_bytes - v.margin_bytes - v.needed_bytes


def test_maxima_are_the_edge_of_fitting() -> None:
    run = make_run(seq=4096)
    t = target("RTX-4090")
    rep = fit_report(SPEC, make_run(seq=4096, weights="nf4"), t)
    assert rep.max_batch is not None
    ok = fit_report(SPEC, run.model_copy(update={"weights": "nf4", "batch": rep.max_batch}), t)
    over = fit_report(SPEC, run.model_copy(update={"weights": "nf4", "batch": rep.max_batch + 1}), t)
    assert ok.fits and not over.fits


def test_a_model_that_does_not_fit_gets_ranked_changes() -> None:
    rep = fit_report(SPEC, make_run(seq=32768, batch=4), target("RTX-4090"))
    assert not rep.fits
    assert rep.verdicts[0].headroom_bytes < 0
    assert rep.changes and rep.changes[0].fits
    fitting = [c for c in rep.changes if c.fits]
    assert all(not c.fits for c in rep.changes[len(fitting) :])  # fitting changes come first
    assert rep.fewest_gpus is not None and rep.fewest_gpus > 1
    for c in fitting:
        run = make_run(seq=32768, batch=4).model_copy(update=c.update)
        t = target("RTX-4090", max(1, run.gpus))
        assert fit_report(SPEC, run, t).fits, c.description


def test_margin_changes_the_verdict() -> None:
    run = make_run(seq=2048)
    est = estimate_inference(SPEC, run)
    tight = GpuTarget(name="x", capacity_bytes=est.total_bytes + GiB // 2)
    assert fit_report(SPEC, run, tight, margin=0).fits
    assert not fit_report(SPEC, run, tight, margin=GiB).fits


def test_free_memory_of_local_gpus_is_used() -> None:
    run = make_run(seq=2048)
    g = find_gpu("RTX-4090")
    busy = GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=1, free_bytes=(4 * GiB,))
    assert not fit_report(SPEC, run, busy).fits


def test_plan_needing_more_gpus_than_given() -> None:
    with pytest.raises(GpumemInputError, match="gpu"):
        fit_report(SPEC, make_run(tp=2), target("RTX-4090", 1))


def test_vllm_reports_kv_tokens_and_concurrency() -> None:
    rep = fit_report(SPEC, make_run(engine="vllm", seq=8192, max_model_len=8192), target("H100-SXM-80GB"))
    f = rep.estimate.facts
    assert f["kv_tokens"] > 8192 and rep.max_concurrency and rep.max_concurrency > 1
    assert f["kv_tokens"] % 16 == 0


def test_local_gpus_pick_the_freest_that_hold_the_plan() -> None:
    g = find_gpu("H100-SXM-80GB")
    free = (70 * GiB, 70 * GiB, 3 * GiB, 2 * GiB)
    t = GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=4, free_bytes=free)
    spec70 = load_config_file(reference_dir() / "configs" / "meta-llama__Llama-2-70b-hf.json")
    rep = fit_report(spec70, make_run(seq=4096, tp=4), t)
    assert not rep.fits
    assert rep.local_gpus == (0, 1) and rep.local_tp == 2
    assert rep.changes[0].kind == "local_gpus" and rep.changes[0].fits
