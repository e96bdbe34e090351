"""Issue 18's rough edges in the fit solvers, the GPU-target parser and the catalog: solvers that answer
"none" instead of raising for values past a field's range, capacities such as 24GiB or 80GB:4, the new
cards, and only strictly smaller formats suggested."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumem_gui.core import (
    GiB,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    MiB,
    SizeUnit,
    TrainingRun,
    find_gpu,
    fit_report,
    fit_training,
    get_weight_format,
    gpu_target_from_text,
    load_model,
    make_run,
    make_training_run,
    maxima_phrases,
)
from gpumem_gui.core.fit import field_max

GEMMA = "google/gemma-3-1b-it"  # small KV cache: 16M generated tokens fit a B200 with an int4 cache


# ---- 2. solvers stay inside the fields' ranges ------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seq=st.integers(1, field_max(InferenceRun, "seq")),
    new=st.integers(0, field_max(InferenceRun, "new_tokens")),
    batch=st.integers(1, field_max(InferenceRun, "batch")),
    engine=st.sampled_from(["transformers", "vllm", "llama.cpp"]),
)
def test_inference_solvers_never_raise_but_input_errors(seq: int, new: int, batch: int, engine: str) -> None:
    spec = load_model(GEMMA).spec
    target = GpuTarget(name="B300", capacity_bytes=find_gpu("B300").memory_bytes, count=8)
    try:
        run = make_run(seq=seq, new_tokens=new, batch=batch, engine=engine, kv_dtype="auto")
    except GpumemInputError:
        return
    try:
        rep = fit_report(spec, run, target)
    except GpumemInputError:
        return  # the run itself is bad input (said in one line); the solvers never raise
    if rep.max_context is not None:
        assert rep.max_context - run.new_tokens <= field_max(InferenceRun, "seq")
    if rep.max_batch is not None:
        assert rep.max_batch <= field_max(InferenceRun, "batch")


def test_training_solvers_stay_inside_the_sequence_range() -> None:
    spec = load_model("Llama-3.2-1B").spec.model_copy(update={"max_position_embeddings": 1 << 23})
    run = make_training_run(seq=field_max(TrainingRun, "seq"), method="qlora", grad_ckpt=True)
    rep = fit_training(spec, run, GpuTarget(name="big", capacity_bytes=4 << 40))
    assert rep.max_context is None or rep.max_context <= field_max(TrainingRun, "seq")


# ---- 6. custom GPU capacity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "capacity", "count", "name"),
    [
        ("24GiB", 24 * GiB, 1, "custom 24 GiB"),
        ("80GB:4", 80 * 10**9, 4, "custom 80 GB"),
        ("23.5GiB:2", 23 * GiB + GiB // 2, 2, "custom 23.5 GiB"),
        ("24 gib", 24 * GiB, 1, "custom 24 GiB"),
        ("512MiB", 512 * MiB, 1, "custom 512 MiB"),
        ("4TiB:4096", 4 << 40, 4096, "custom 4 TiB"),
        (" 0.5TB ", 5 * 10**11, 1, "custom 0.5 TB"),
    ],
)
def test_gpu_capacity_text(text: str, capacity: int, count: int, name: str) -> None:
    t = gpu_target_from_text(text)
    assert (t.capacity_bytes, t.count, t.name) == (capacity, count, name)


def test_catalog_names_still_parse() -> None:
    h100 = find_gpu("H100")
    assert gpu_target_from_text("H100:4") == GpuTarget(
        name="H100-SXM-80GB", capacity_bytes=h100.memory_bytes, cuda_bytes=h100.cuda_memory_bytes, count=4
    )
    assert gpu_target_from_text("4090").name == "RTX-4090"  # a catalog alias that is a bare number


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("24", "a capacity needs a unit"),
        ("24XB", "unknown unit 'XB'"),
        ("100MB", "must be 512 MiB to 4 TiB"),
        ("5TiB", "must be 512 MiB to 4 TiB"),
        ("24GiB:0", "GPU count must be 1 to 4,096"),
        ("", "give a catalog GPU"),
        ("y" * 81, "is too long"),
        ("quantum-9000", "unknown GPU"),
    ],
)
def test_bad_gpu_text(text: str, problem: str) -> None:
    with pytest.raises(GpumemInputError, match=problem) as e:
        gpu_target_from_text(text)
    assert e.value.field == "gpu" and len(str(e.value)) < 240


# ---- 7. the new cards --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu_id", "mib"),
    [
        ("B300", "B300-288GB", 275040),
        ("RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell", 97887),
        ("rtx-pro-6000", "RTX-PRO-6000-Blackwell", 97887),
        ("H20", "H20-96GB", 97871),
        ("RTX 5080", "RTX-5080", 16303),
        ("GeForce RTX 5070 Ti", "RTX-5070-Ti", 16303),
        ("L20", "L20", 46068),
    ],
)
def test_new_nvidia_cards_carry_the_driver_totals(name: str, gpu_id: str, mib: int) -> None:
    g = find_gpu(name)
    assert (g.id, g.memory_bytes, g.memory_kind) == (gpu_id, mib * MiB, "driver")
    assert g.source.startswith("https://") and f"{mib} MiB" in g.memory_source


def test_mi355x_is_288_gib_nominal() -> None:
    g = find_gpu("Instinct-MI355X")
    assert (g.id, g.memory_bytes, g.memory_kind, g.vendor) == ("MI355X", 288 * GiB, "nominal", "amd")


# ---- 8. only strictly smaller formats; the window's words --------------------------------------------------


def test_only_strictly_smaller_formats_when_it_misses() -> None:
    spec = load_model("Llama-3.1-8B").spec
    rep = fit_report(spec, make_run(weights="bf16"), GpuTarget(name="16GB", capacity_bytes=16 * 10**9))
    assert not rep.fits and rep.smallest_weights is not None
    assert get_weight_format(rep.smallest_weights).bits < 16


def test_window_report_uses_the_same_words() -> None:
    from gpumem_gui.ui.report import markdown_report

    m = load_model("Llama-3.1-70B-Instruct")
    run = make_run(weights="bf16")
    rep = fit_report(
        m.spec, run, GpuTarget(name="RTX-4090", capacity_bytes=find_gpu("RTX-4090").memory_bytes)
    )
    md = markdown_report(
        m, run, rep.estimate, rep, unit=SizeUnit.GIB, target_text="1 x RTX 4090", command="c", flags=""
    )
    line = next(x for x in md.splitlines() if x.startswith("Limits on this target:"))
    assert line == f"Limits on this target: {', '.join(maxima_phrases(rep))}."
    assert "no batch size fits" in line and "None" not in line
