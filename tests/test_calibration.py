"""Issue 32 item 3: a calibration from a measurement (core): what the figures imply, how it applies to an
estimate (totals move by exactly the calibrated difference, on every GPU and rank), which GPU it matches."""

from __future__ import annotations

from datetime import date

import pytest

from gpumem_gui.core import (
    Calibration,
    GpumemInputError,
    Stack,
    apply_calibration,
    calibration_for,
    calibration_from,
    catalog_target,
    estimate_inference,
    estimate_training,
    find_gpu,
    fit_report,
    fit_training,
    gpu_identity,
    load_model,
    make_run,
    make_training_run,
)
from gpumem_gui.core.observed import ObservedMemory

GiB = 1 << 30
MiB = 1 << 20
DAY = date(2026, 12, 7)


def _gib(x: float) -> int:
    return round(x * GiB)


# The OOM message issue 32 quotes (PyTorch's current form, c10/cuda/CUDACachingAllocator.cpp): "Tried to
# allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.19 GiB is free. Including non-PyTorch
# memory, this process has 77.95 GiB memory in use. Of the allocated memory 74.36 GiB is allocated by PyTorch,
# and 2.93 GiB is reserved by PyTorch but unallocated."
OOM = ObservedMemory(
    source_format="torch_oom",
    gpu_index=0,
    total_bytes=_gib(79.15),
    free_bytes=_gib(1.19),
    process_bytes=_gib(77.95),
    allocated_bytes=_gib(74.36),
    reserved_unallocated_bytes=_gib(2.93),
    requested_bytes=_gib(2.00),
    excerpt="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...",
)


def _oom_calibration(name: str = "h100-oom", **kw: object) -> Calibration:
    return calibration_from((OOM,), None, name=name, gpu_name="H100-SXM-80GB", measured_on=DAY, **kw)  # type: ignore[arg-type]


def test_oom_message_gives_non_torch_and_the_allocator_ratio() -> None:
    cal = _oom_calibration()
    assert cal.non_torch_bytes == _gib(77.95) - _gib(74.36) - _gib(2.93)
    assert cal.allocator_ratio == pytest.approx((_gib(74.36) + _gib(2.93)) / _gib(74.36))
    assert cal.gpu_total_bytes == _gib(79.15)
    assert cal.measurement.source_formats == ("torch_oom",)
    assert cal.measurement.figures["process_bytes"] == _gib(77.95)
    assert "this process has 77.95 GiB" in cal.non_torch_formula
    assert cal.measurement.excerpt.startswith("torch.OutOfMemoryError")


def test_nvidia_smi_used_and_memory_summary_reserved_from_two_records() -> None:
    smi = ObservedMemory(source_format="nvidia_smi_table", gpu_index=0, gpu_name="NVIDIA H100 80GB HBM3",
                         total_bytes=81559 * MiB, used_bytes=20480 * MiB)  # fmt: skip
    summary = ObservedMemory(source_format="torch_memory_summary", allocated_bytes=18000 * MiB,
                             reserved_bytes=19200 * MiB, peak_allocated_bytes=18500 * MiB,
                             peak_reserved_bytes=19500 * MiB)  # fmt: skip
    cal = calibration_from((smi, summary), None, name="smi", measured_on=DAY)
    assert cal.gpu_name == "NVIDIA H100 80GB HBM3"
    assert cal.non_torch_bytes == (20480 - 19200) * MiB
    assert "every process" in cal.non_torch_formula  # nvidia-smi's used counts every process on the GPU
    assert cal.allocator_ratio == pytest.approx(19500 / 18500)  # the peaks, where the text states both


def test_peak_reserved_against_the_estimate_of_the_named_run() -> None:
    m = load_model("Llama-3.1-8B")
    est = estimate_inference(m.spec, make_run(seq=1024))
    rec = ObservedMemory(source_format="torch_memory_stats", peak_reserved_bytes=est.peak_bytes + 300 * MiB)
    cal = calibration_from((rec,), est, name="peak", gpu_name="H100", measured_on=DAY)
    assert cal.allocator_ratio == pytest.approx((est.peak_bytes + 300 * MiB) / est.peak_bytes)
    assert cal.non_torch_bytes is None
    with pytest.raises(GpumemInputError, match=r"does not state .*PyTorch's reserved.*nor"):
        calibration_from((rec,), None, name="peak", gpu_name="H100", measured_on=DAY)
    low = rec.model_copy(update={"peak_reserved_bytes": est.peak_bytes - 300 * MiB})
    with pytest.raises(GpumemInputError, match="is below the estimate's"):  # no overhead to learn from it
        calibration_from((low,), est, name="peak", gpu_name="H100", measured_on=DAY)


@pytest.mark.parametrize(
    ("records", "kw", "message"),
    [
        (
            (ObservedMemory(source_format="nvidia_smi_csv", used_bytes=GiB),),
            {"gpu_name": "H100"},
            "cannot calibrate",
        ),
        ((OOM,), {}, "does not name its GPU"),
        ((OOM, OOM.model_copy(update={"gpu_index": 1})), {"gpu_name": "H100"}, "pick one with --gpu-index"),
        ((OOM,), {"gpu_name": "H100", "gpu_index": 3}, "has no GPU 3"),
        ((OOM.model_copy(update={"gpu_name": "NVIDIA A100-SXM4-80GB"}),), {"gpu_name": "H100"}, "not 'H100'"),
        ((OOM.model_copy(update={"process_bytes": GiB}),), {"gpu_name": "H100"}, "below PyTorch's reserved"),
    ],
)
def test_what_cannot_calibrate_is_one_line(records: tuple, kw: dict, message: str) -> None:
    with pytest.raises(GpumemInputError, match=message) as e:
        calibration_from(records, None, name="x", measured_on=DAY, **kw)
    assert "\n" not in str(e.value)


def _by_key(comps: tuple) -> dict[str, int]:
    return {c.key: c.bytes for c in comps}


def test_apply_moves_every_total_by_exactly_the_calibrated_difference() -> None:
    m = load_model("Llama-3.1-8B")
    est = estimate_inference(m.spec, make_run(seq=2048, pp=2))
    cal = _oom_calibration()
    out = apply_calibration(est, cal)
    assert out.peak_bytes == est.peak_bytes and out.phases == est.phases
    for before, after in zip(est.per_gpu, out.per_gpu, strict=True):
        old, new = _by_key(before.components), _by_key(after.components)
        assert "cuda_context" not in new and new["non_torch"] == cal.non_torch_bytes
        reserve = round(before.peak_bytes * (cal.allocator_ratio - 1))
        assert new["allocator_reserve"] == reserve
        assert new["workspace"] == old["workspace"]  # allocated by PyTorch's allocator: not replaced
        moved = (cal.non_torch_bytes - old["cuda_context"]) + (reserve - old["allocator_reserve"])
        assert after.total_bytes == before.total_bytes + moved
        overheads = sum(new[k] for k in ("non_torch", "workspace", "allocator_reserve"))
        assert after.total_bytes == after.peak_bytes + overheads  # the share's total, rebuilt from its parts
    assert out.total_bytes == max(s.total_bytes for s in out.per_gpu)
    assert out.facts["calibration"] == "h100-oom"
    assert apply_calibration(out, _oom_calibration("other")) == out  # applied once only
    note = out.component("non_torch")
    assert note is not None and "h100-oom" in note.label
    assert "2026-12-07" in note.explain.source and "torch_oom" in note.explain.source


def test_apply_with_only_one_quantity_keeps_the_other_default() -> None:
    m = load_model("Llama-3.1-8B")
    est = estimate_inference(m.spec, make_run(seq=1024))
    cal = _oom_calibration().model_copy(update={"allocator_ratio": None})
    out = apply_calibration(est, cal)
    assert _by_key(out.components)["allocator_reserve"] == _by_key(est.components)["allocator_reserve"]
    assert out.total_bytes - est.total_bytes == cal.non_torch_bytes - _by_key(est.components)["cuda_context"]


def test_apply_to_training_updates_each_rank_class_and_who_decides() -> None:
    m = load_model("Llama-3.1-8B")
    est = estimate_training(m.spec, make_training_run(batch=1, seq=512, pp=2, grad_ckpt=True))
    cal = _oom_calibration()
    out = apply_calibration(est, cal)
    for before, after in zip(est.ranks, out.ranks, strict=True):
        old, new = _by_key(before.components), _by_key(after.components)
        # the measured non-PyTorch memory replaces the context; NCCL's buffers (pipeline send / recv) stay
        # modelled, they scale with the layout
        moved = (cal.non_torch_bytes - old["cuda_context"]) + (
            new["allocator_reserve"] - old["allocator_reserve"]
        )
        assert old["nccl_buffers"] == new["nccl_buffers"] > 0
        assert after.total_bytes == before.total_bytes + moved
    worst = max(range(len(out.ranks)), key=lambda i: out.ranks[i].total_bytes)
    assert [r.decides for r in out.ranks] == [i == worst for i in range(len(out.ranks))]


def test_an_engine_without_the_replaced_components_is_left_alone_with_a_warning() -> None:
    m = load_model("Llama-3.1-8B")
    est = estimate_inference(m.spec, make_run(engine="vllm", max_model_len=4096), find_gpu("H100").gpu_memory)
    out = apply_calibration(est, _oom_calibration())
    assert out.total_bytes == est.total_bytes and out.components == est.components
    assert "not applied" in out.warnings[-1]


def test_matching_by_gpu_name_in_any_spelling_and_by_engine() -> None:
    assert gpu_identity("NVIDIA H100 80GB HBM3") == gpu_identity("h100") == "H100-SXM-80GB"
    assert gpu_identity("NVIDIA GeForce RTX 4090") == "RTX-4090"
    assert gpu_identity("AMD Instinct MI300X") == "MI300X"
    assert gpu_identity("Some Card 7") == gpu_identity("some_card-7")  # not in the catalog: by its name
    old = _oom_calibration("old", engine="transformers", mode="inference")
    new = old.model_copy(
        update={
            "name": "new",
            "measurement": old.measurement.model_copy(update={"measured_on": date(2027, 1, 1)}),
        }
    )
    a100 = old.model_copy(update={"name": "a100", "gpu_name": "NVIDIA A100-SXM4-80GB"})
    cals = (new, old, a100)
    infer, train = make_run(), make_training_run()
    assert calibration_for(cals, "NVIDIA H100 80GB HBM3", infer) is new
    assert calibration_for(cals, "A100-80GB", infer) is a100
    assert calibration_for(cals, "H100", make_run(engine="vllm")) is None
    assert calibration_for(cals, "RTX-4090", infer) is None
    assert calibration_for(cals, "H100", train) is None  # measured in inference: the allocator differs
    anymode = old.model_copy(update={"name": "any", "mode": None})
    assert calibration_for((anymode,), "H100", train) is anymode


def test_fit_on_a_calibrated_target_uses_the_calibrated_totals() -> None:
    m = load_model("Llama-3.1-8B")
    run = make_run(seq=2048)
    cal = _oom_calibration()
    target = catalog_target(find_gpu("H100")).model_copy(update={"calibration": cal})
    rep = fit_report(m.spec, run, target)
    plain = fit_report(m.spec, run, catalog_target(find_gpu("H100")))
    assert rep.estimate.total_bytes == apply_calibration(plain.estimate, cal).total_bytes
    assert rep.verdicts[0].needed_bytes == rep.estimate.total_bytes != plain.verdicts[0].needed_bytes
    # training fits too, and a target without a calibration serializes as before
    trep = fit_training(m.spec, make_training_run(batch=1, seq=512, grad_ckpt=True), target)
    assert trep.estimate.facts["calibration"] == "h100-oom"
    assert "calibration" not in catalog_target(find_gpu("H100")).model_dump()


def test_calibration_fields_are_validated() -> None:
    cal = _oom_calibration(stack=Stack(torch="2.13.0", driver="580.65"))
    assert "torch 2.13.0" in cal.stack.text()
    with pytest.raises(ValueError, match="name"):
        Calibration.model_validate({**cal.model_dump(), "name": "two\nlines"})
    with pytest.raises(ValueError, match="needs the non-PyTorch memory"):
        Calibration.model_validate({**cal.model_dump(), "non_torch_bytes": None, "allocator_ratio": None})
    with pytest.raises(ValueError, match="allocator_ratio"):
        Calibration.model_validate({**cal.model_dump(), "allocator_ratio": 0.5})


def test_nvidia_smis_one_listed_process_is_the_process_figure() -> None:
    from gpumem_gui.core.observed import ObservedProcess

    smi = ObservedMemory(
        source_format="nvidia_smi_table",
        gpu_index=0,
        gpu_name="NVIDIA GeForce RTX 4090",
        used_bytes=12 * GiB,  # the desktop's memory too: not the process's
        processes=(ObservedProcess(pid=4242, name="python", bytes=10 * GiB),),
    )
    summary = ObservedMemory(
        source_format="torch_memory_summary", allocated_bytes=9 * GiB, reserved_bytes=9 * GiB + GiB // 2
    )
    cal = calibration_from((smi, summary), None, name="one", measured_on=DAY)
    assert cal.non_torch_bytes == GiB // 2 and "process 4242 uses" in cal.non_torch_formula
    two = smi.model_copy(update={"processes": (*smi.processes, ObservedProcess(pid=1, bytes=GiB))})
    cal2 = calibration_from((two, summary), None, name="two", measured_on=DAY)
    assert cal2.non_torch_bytes is None  # two processes listed: the text does not say which one ran
    assert cal2.allocator_ratio == pytest.approx(9.5 / 9)


def test_a_measurement_of_a_multi_gpu_run_keeps_its_nccl_buffers_out_of_the_calibration() -> None:
    """The NCCL buffers gpumem models for the measured run are taken off the measured non-PyTorch memory, so
    a later run with another layout counts its own (and a one-GPU run none) instead of the measured run's."""
    m = load_model("Llama-3.1-8B")
    one = estimate_training(m.spec, make_training_run(batch=1, seq=512, grad_ckpt=True))
    two = estimate_training(m.spec, make_training_run(batch=1, seq=512, pp=2, grad_ckpt=True))
    nccl = max(c.bytes for c in two.components if c.key == "nccl_buffers")
    kw = {"name": "x", "gpu_name": "H100", "measured_on": DAY}
    alone, measured_pp = calibration_from((OOM,), one, **kw), calibration_from((OOM,), two, **kw)
    assert alone.non_torch_bytes - measured_pp.non_torch_bytes == nccl
    assert "NCCL buffers modelled for the measured run" in measured_pp.non_torch_formula
