"""Issue 32 item 2: the diagnosis core on constructed records: each part's arithmetic, the fragmentation and
other-process verdicts, and a run against the estimate (one that fits, one that does not, one the estimate
did not see coming), the changes from the fit report, and the gpumem.diagnosis/1 document."""

from __future__ import annotations

import pytest

from gpumem_gui.core import (
    DIAGNOSIS_SCHEMA,
    OBSERVED_KEYS,
    GpuTarget,
    MiB,
    ObservedMemory,
    diagnose,
    diagnosis_document,
    fit_report,
    load_model,
    make_run,
)

SPEC = load_model("meta-llama/Llama-3.2-1B").spec


def oom(**figures: int) -> ObservedMemory:
    """A PyTorch OOM record (current form) with the figures in MiB."""
    return ObservedMemory(source_format="torch_oom", gpu_index=0, **{k: v * MiB for k, v in figures.items()})


# the example in whole MiB: 80,000 total, 1,000 free, this process 78,000 (74,000 allocated + 3,000
# reserved-unallocated + 1,000 outside PyTorch), so 1,000 in other processes; 2,000 requested
EXAMPLE = dict(
    total_bytes=80_000,
    free_bytes=1_000,
    process_bytes=78_000,
    allocated_bytes=74_000,
    reserved_unallocated_bytes=3_000,
    requested_bytes=2_000,
)


def parts(o: ObservedMemory) -> dict[str, int | None]:
    return {p.key: p.bytes for p in diagnose(o).parts}


def test_each_part_is_its_difference_and_they_add_up_to_the_total() -> None:
    got = parts(oom(**EXAMPLE))
    assert got == {
        "tensors": 74_000 * MiB,
        "allocator_cache": 3_000 * MiB,
        "outside_pytorch": 1_000 * MiB,  # process - (allocated + reserved-unallocated)
        "other_processes": 1_000 * MiB,  # total - free - process
        "free": 1_000 * MiB,
    }
    assert sum(v or 0 for v in got.values()) == 80_000 * MiB


def test_reserved_stated_instead_of_unallocated() -> None:
    o = oom(
        total_bytes=16_000,
        free_bytes=500,
        allocated_bytes=10_000,
        reserved_bytes=12_000,
        process_bytes=13_000,
    )
    got = parts(o)
    assert got["allocator_cache"] == 2_000 * MiB and got["outside_pytorch"] == 1_000 * MiB
    assert got["other_processes"] == 2_500 * MiB


def test_unknown_figures_leave_their_parts_unknown_never_guessed() -> None:
    d = diagnose(oom(allocated_bytes=1_000, requested_bytes=10))
    by_key = {p.key: p for p in d.parts}
    assert by_key["tensors"].bytes == 1_000 * MiB
    assert by_key["allocator_cache"].bytes is None and "not stated" in by_key["allocator_cache"].note
    assert "free" not in by_key and "other_processes" not in by_key  # nothing they need is stated
    assert d.causes.fragmentation is None and d.causes.shortfall_bytes is None


def test_no_process_figure_gives_one_part_for_what_is_beyond_pytorch() -> None:
    # the legacy form: no "this process has" sentence; used - reserved is non-PyTorch memory and others
    o = ObservedMemory(
        source_format="torch_oom_legacy",
        total_bytes=6_000 * MiB,
        free_bytes=3_000 * MiB,
        allocated_bytes=800 * MiB,
        reserved_bytes=1_300 * MiB,
        requested_bytes=2_300 * MiB,
    )
    assert parts(o) == {
        "tensors": 800 * MiB,
        "allocator_cache": 500 * MiB,
        "outside_pytorch_or_others": 1_700 * MiB,
        "free": 3_000 * MiB,
    }


def test_nvidia_smi_record_without_a_process_split() -> None:
    o = ObservedMemory(source_format="nvidia_smi_table", total_bytes=81_559 * MiB, used_bytes=70_000 * MiB)
    assert parts(o) == {"every_process": 70_000 * MiB}
    o = o.model_copy(update={"process_bytes": 69_000 * MiB})
    assert parts(o) == {"this_process": 69_000 * MiB, "other_processes": 1_000 * MiB}


def test_rounding_of_printed_figures_is_zero_with_a_note_and_a_real_disagreement_is_named() -> None:
    # process 5 MiB below reserved: within the 0.01 GiB PyTorch prints (format_size), so 0 with a note
    d = diagnose(
        oom(
            total_bytes=20_000,
            free_bytes=0,
            process_bytes=15_995,
            allocated_bytes=15_000,
            reserved_bytes=16_000,
        )
    )
    outside = next(p for p in d.parts if p.key == "outside_pytorch")
    assert outside.bytes == 0 and "rounding" in outside.note
    d = diagnose(
        oom(
            total_bytes=20_000,
            free_bytes=0,
            process_bytes=14_000,
            allocated_bytes=15_000,
            reserved_bytes=16_000,
        )
    )
    outside = next(p for p in d.parts if p.key == "outside_pytorch")
    assert outside.bytes == 0 and "disagree" in outside.note


def test_fragmentation_when_the_request_fits_in_the_reserved_unallocated() -> None:
    d = diagnose(oom(**EXAMPLE))
    assert d.causes.fragmentation is True and d.causes.failed
    assert any(line.startswith("fragmentation") for line in d.causes.lines)
    assert [c.description.split(":")[0] for c in d.changes[:2]] == [
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments",
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb",
    ]
    assert all(c.total_bytes is None and c.fits is None and "cuda.rst" in c.source for c in d.changes[:2])


def test_no_fragmentation_when_the_request_is_larger_than_the_cache() -> None:
    d = diagnose(oom(**{**EXAMPLE, "requested_bytes": 3_001}))
    assert d.causes.fragmentation is False
    assert not any("expandable_segments" in c.description for c in d.changes)


def test_other_processes_named_where_they_hold_the_shortfall() -> None:
    # 1,000 MiB free, 2,000 requested: 1,000 missing, and other processes hold 1,000 -> enough alone
    d = diagnose(oom(**EXAMPLE))
    assert d.causes.other_processes_bytes == 1_000 * MiB and d.causes.shortfall_bytes == 1_000 * MiB
    assert d.causes.other_processes_cause is True
    assert any(c.kind == "other_processes" for c in d.changes)
    # holding less than the shortfall: named in the causes, not offered as the change that makes it fit
    d = diagnose(oom(**{**EXAMPLE, "requested_bytes": 2_001}))
    assert d.causes.other_processes_cause is False
    assert not any(c.kind == "other_processes" for c in d.changes)


def test_other_processes_within_rounding_are_not_claimed() -> None:
    # total - free - process = 10 MiB, under the 3 x 5 MiB the three printed figures may be off by
    d = diagnose(
        oom(
            total_bytes=80_000,
            free_bytes=1_000,
            process_bytes=78_990,
            allocated_bytes=70_000,
            requested_bytes=2_000,
        )
    )
    assert d.causes.other_processes_bytes is None
    others = next(p for p in d.parts if p.key == "other_processes")
    assert others.bytes == 10 * MiB and "may be 0" in others.note


def _run_on_observed(batch: int, total_mib: int, failed: bool) -> tuple:
    run = make_run(batch=batch, seq=2048)
    figures = dict(total_bytes=total_mib, free_bytes=100, process_bytes=total_mib - 100)
    figures.update(allocated_bytes=total_mib - 1_000, reserved_unallocated_bytes=400)
    if failed:
        figures["requested_bytes"] = 900
    return run, diagnose(oom(**figures), spec=SPEC, run=run)


def test_a_run_that_fits_and_ran_agrees() -> None:
    _, d = _run_on_observed(1, 80_000, failed=False)
    p = d.prediction
    assert p is not None and p.predicted_fits and not p.observed_failed and p.agrees
    assert p.capacity_bytes == 80_000 * MiB and "the report's total" in p.capacity_source
    assert p.missed_bytes == p.observed_needed_bytes - p.needed_bytes
    assert d.estimate is not None and set(d.phases) == set(d.estimate.phases)


def test_a_run_that_does_not_fit_and_failed_was_predicted() -> None:
    run, d = _run_on_observed(256, 16_000, failed=True)
    p = d.prediction
    assert p is not None and not p.predicted_fits and p.observed_failed and p.agrees
    assert p.needed_bytes > p.available_bytes
    assert p.summary.startswith("the estimate predicted the failure")
    # the run changes are the fit report's on the observed GPU, the other processes' memory kept free
    rep = fit_report(SPEC, run, GpuTarget(name="the observed GPU", capacity_bytes=16_000 * MiB), margin=0)
    ours = [(c.description, c.total_bytes, c.fits) for c in d.changes if c.update]
    assert ours and sorted(ours, key=str) == sorted(
        ((c.description, c.total_bytes, c.fits) for c in rep.changes), key=str
    )
    # a run that does not fit at all: the run changes that fit come before the allocator's settings
    fits = [c.fits for c in d.changes]
    assert fits[0] is True


def test_a_failure_the_estimate_did_not_see_says_by_how_much_it_missed() -> None:
    _, d = _run_on_observed(1, 80_000, failed=True)  # the process held 79.9 GB; the estimate needs ~3 GiB
    p = d.prediction
    assert p is not None and p.predicted_fits and p.observed_failed and not p.agrees
    assert p.observed_needed_bytes == (80_000 - 100 + 900) * MiB
    assert p.missed_bytes == p.observed_needed_bytes - p.needed_bytes > 0
    assert "did not predict" in p.summary
    tensors = next(c for c in d.compared if c.key == "tensors")
    assert tensors.observed_bytes == (80_000 - 1_000 + 900) * MiB
    assert tensors.difference_bytes == tensors.observed_bytes - d.estimate.peak_bytes
    assert d.phase_reached is None  # no phase of the estimate holds that many tensors


def test_no_total_and_no_gpu_means_no_verdict_but_a_comparison() -> None:
    o = ObservedMemory(source_format="torch_memory_summary", allocated_bytes=3 * 1024 * MiB)
    d = diagnose(o, spec=SPEC, run=make_run())
    assert d.prediction is None and "no total" in d.no_prediction and d.compared
    target = GpuTarget(name="RTX", capacity_bytes=24 * 1024 * MiB)
    d = diagnose(o, spec=SPEC, run=make_run(), target=target)
    assert d.prediction is not None and d.prediction.capacity_bytes == 24 * 1024 * MiB


def test_document_keys() -> None:
    doc = diagnosis_document(diagnose(oom(total_bytes=1_000, allocated_bytes=10)))
    assert doc["schema"] == DIAGNOSIS_SCHEMA == "gpumem.diagnosis/1"
    assert list(doc["observed"])[:6] == list(OBSERVED_KEYS)
    assert doc["observed"]["free_bytes"] is None and doc["observed"]["total_bytes"] == 1_000 * MiB
    for key in ("source_format", "derived", "unread"):
        assert key in doc["observed"]
    for key in ("parts", "estimate", "predicted_failure", "changes"):
        assert key in doc
    assert doc["estimate"] is None and doc["predicted_failure"] is None


@pytest.mark.parametrize("fmt", ["nvidia_smi_table", "torch_oom"])
def test_capacity_names_whose_total_it_is(fmt: str) -> None:
    o = ObservedMemory(
        source_format=fmt, total_bytes=81_559 * MiB, free_bytes=10_000 * MiB, process_bytes=70_000 * MiB
    )
    d = diagnose(o, spec=SPEC, run=make_run())
    assert d.prediction is not None
    assert ("nvidia-smi" in d.prediction.capacity_source) == (fmt == "nvidia_smi_table")


def test_an_engines_lines_beside_the_estimates_components() -> None:
    # SGLang states its K and V pools apart: they are summed into the estimate's one KV pool
    o = ObservedMemory(
        source_format="sglang",
        total_bytes=80 * 1024 * MiB,
        parts={"weights": 2_400 * MiB, "kv_cache_k": 30_000 * MiB, "kv_cache_v": 30_000 * MiB},
    )
    d = diagnose(o, spec=SPEC, run=make_run(engine="sglang"))
    rows = {c.key: c for c in d.compared}
    est = d.estimate
    assert rows["engine_kv_cache"].observed_bytes == 60_000 * MiB
    assert rows["engine_kv_cache"].estimated_bytes == est.component("kv_cache").bytes
    assert rows["engine_weights"].difference_bytes == 2_400 * MiB - est.component("weights").bytes
    assert "kv_cache_k + kv_cache_v" in rows["engine_kv_cache"].explain.formula


def test_non_pytorch_memory_and_the_cache_beside_the_estimates_overheads() -> None:
    d = diagnose(oom(**EXAMPLE), spec=SPEC, run=make_run())
    rows = {c.key: c for c in d.compared}
    est = d.estimate
    assert rows["outside_pytorch"].observed_bytes == 1_000 * MiB
    assert rows["outside_pytorch"].estimated_bytes == est.component("cuda_context").bytes
    assert rows["allocator_cache"].observed_bytes == 3_000 * MiB
    assert rows["allocator_cache"].estimated_bytes == est.component("allocator_reserve").bytes
    # the three whole-process rows come first, in this order
    assert [c.key for c in d.compared][:3] == ["tensors", "non_tensor", "process"]


def test_tensors_compared_are_the_most_the_process_held_or_asked_for() -> None:
    summary = ObservedMemory(
        source_format="torch_memory_summary", allocated_bytes=1_000 * MiB, peak_allocated_bytes=2_600 * MiB
    )
    d = diagnose(summary, spec=SPEC, run=make_run())
    tensors = next(c for c in d.compared if c.key == "tensors")
    assert tensors.observed_bytes == 2_600 * MiB  # max_memory_allocated, more than allocated now
    wanted = 2_600 * MiB
    assert d.phase_reached == next((n for n, b in d.phases.items() if b >= wanted), None)
    failed = oom(allocated_bytes=2_000, peak_allocated_bytes=2_100, requested_bytes=500, process_bytes=2_900)
    d = diagnose(failed, spec=SPEC, run=make_run())
    rows = {c.key: c for c in d.compared}
    assert rows["tensors"].observed_bytes == 2_500 * MiB  # allocated + the request, more than the peak
    assert rows["non_tensor"].observed_bytes == 900 * MiB  # process - allocated, the same moment
    assert rows["process"].observed_bytes == 3_400 * MiB  # process + the request
