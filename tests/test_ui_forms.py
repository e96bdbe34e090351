"""The run form and the GPU target form: value()/set_value() round trips, one `changed` signal, inline
errors."""

from __future__ import annotations

import pytest

from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.ui.run_form import PRESETS, RunForm
from gpumem_gui.ui.target_form import GpuChoice, TargetForm, resolve_target

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

RUNS = [
    InferenceRun(),
    InferenceRun(batch=8, seq=32768, new_tokens=1024, weights="nf4", compute_dtype="fp16", kv_dtype="int8"),
    InferenceRun(attn="eager", logits="all", tp=4, pp=2, ep=1, cuda_context_mib=350),
    InferenceRun(
        engine="vllm",
        batch=64,
        weights="fp8",
        kv_dtype="fp8_e5m2",
        gpu_memory_utilization=0.85,
        max_num_seqs=128,
        max_model_len=65536,
        max_num_batched_tokens=16384,
        enforce_eager=True,
    ),
    InferenceRun(
        engine="llama.cpp",
        weights="gguf-Q5_K_M",
        kv_dtype="q8_0",
        n_gpu_layers=20,
        n_batch=4096,
        n_ubatch=1024,
        flash_attn=False,
    ),
    *(p.run for p in PRESETS),
]


@pytest.fixture
def form(qtbot) -> RunForm:
    f = RunForm()
    qtbot.addWidget(f)
    return f


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.engine}-{r.weights}-{r.kv_dtype}")
def test_run_form_round_trip(form: RunForm, qtbot, run: InferenceRun) -> None:
    with qtbot.assertNotEmitted(form.changed):
        form.set_value(run)
    assert form.value() == run


def test_file_weights_round_trip(form: RunForm) -> None:
    run = InferenceRun(weights="file")
    form.set_value(run)
    assert form.value() == run
    form.set_file_weights_available(False)  # a model without weight files: back to a formula format
    assert form.value().weights == "bf16"


def test_one_changed_signal_per_edit(form: RunForm, qtbot) -> None:
    with qtbot.waitSignal(form.changed, timeout=1000):
        form.widget("batch").setValue(7)
    assert form.value().batch == 7


def test_engine_filters_kv_dtypes_and_shows_its_knobs(form: RunForm) -> None:
    form.show()
    engine = form.widget("engine")
    kv = form.widget("kv_dtype")

    def kv_items() -> list[str]:
        return [kv.itemData(i) for i in range(kv.count())]

    engine.setCurrentIndex(engine.findData("vllm"))
    assert "fp8" in kv_items() and "q8_0" not in kv_items()
    assert form.groups["vLLM"].isVisible() and not form.groups["llama.cpp"].isVisible()
    engine.setCurrentIndex(engine.findData("llama.cpp"))
    assert "q8_0" in kv_items() and "fp8" not in kv_items()
    assert form.groups["llama.cpp"].isVisible() and not form.groups["vLLM"].isVisible()
    engine.setCurrentIndex(engine.findData("transformers"))
    assert set(kv_items()) == {"auto", "fp32", "fp16", "bf16", "int8", "int4"}
    assert not form.groups["vLLM"].isVisible() and not form.groups["llama.cpp"].isVisible()


def test_kv_dtype_falls_back_to_auto_when_the_engine_cannot_store_it(form: RunForm) -> None:
    form.set_value(InferenceRun(engine="vllm", kv_dtype="fp8"))
    engine = form.widget("engine")
    engine.setCurrentIndex(engine.findData("transformers"))
    assert form.value().kv_dtype == "auto"


def test_every_field_has_a_tooltip_and_weights_are_grouped(form: RunForm) -> None:
    for name in InferenceRun.model_fields:
        assert form.widget(name).toolTip(), name
    weights = form.widget("weights")
    headers = [weights.itemText(i) for i in range(weights.count()) if weights.itemData(i) is None]
    assert "Float" in headers and "GPTQ" in headers and any(h.startswith("GGUF") for h in headers)


def test_model_level_error_shows_next_to_the_field_it_names(form: RunForm) -> None:
    form.set_value(InferenceRun(engine="llama.cpp"))
    form.widget("n_ubatch").setValue(4096)  # n_batch is 2048
    assert form.checked_value() is None
    assert "n_ubatch" in form.error_text("n_ubatch")
    form.widget("n_batch").setValue(4096)
    assert form.checked_value() is not None
    assert form.error_text("n_ubatch") == ""


def test_show_error_for_an_unknown_field_goes_above_the_form(form: RunForm) -> None:
    form.show_error("nonsense", "something is off")
    assert form.error_text() == "something is off"
    form.clear_errors()
    assert not form.has_errors()


# ---- the GPU target -------------------------------------------------------------------------------------


@pytest.fixture
def target(qtbot) -> TargetForm:
    f = TargetForm()
    qtbot.addWidget(f)
    return f


@pytest.mark.parametrize(
    "choice",
    [
        GpuChoice(),
        GpuChoice(gpu_id="H100-SXM-80GB", count=8, margin_mib=2048),
        GpuChoice(gpu_id="MI300X", count=2, margin_mib=0, basis="total"),
        GpuChoice(kind="local", device="3", count=2),
    ],
)
def test_target_form_round_trip(target: TargetForm, qtbot, choice: GpuChoice) -> None:
    with qtbot.assertNotEmitted(target.changed):
        target.set_value(choice)
    assert target.value() == choice


def test_local_devices_are_offered(target: TargetForm, fake_snapshots) -> None:
    (snap,) = fake_snapshots("8xh100_busy")
    target.set_local_devices(snap.devices)
    target.set_value(GpuChoice(kind="local", device="5", count=2))
    assert target.value().device == "5"
    combo = target.widget("gpu")
    texts = [combo.itemText(i) for i in range(combo.count())]
    assert sum("GPU" in t and "H100 80GB HBM3" in t for t in texts) == 8


def test_resolve_local_target_uses_free_memory(fake_snapshots) -> None:
    from gpumem_gui.core.units import SizeUnit

    (snap,) = fake_snapshots("8xh100_busy")
    r = resolve_target(GpuChoice(kind="local", device="4", count=4), snap, SizeUnit.GIB)
    # count N: the picked GPU and the N - 1 freest others, in index order
    others = sorted(
        (d for d in snap.physical_devices if d.key != "4"), key=lambda d: (-d.free_bytes, d.index)
    )
    expected = sorted(["4", *(d.key for d in others[:3])], key=int)
    assert r.target.count == 4 and list(r.devices) == expected
    assert r.target.free_bytes == tuple(snap.device(k).free_bytes for k in r.devices)
    least_free_taken = min(snap.device(k).free_bytes for k in r.devices if k != "4")
    assert all(d.free_bytes <= least_free_taken for d in snap.physical_devices if d.key not in r.devices)
    total = resolve_target(GpuChoice(kind="local", device="4", count=4, basis="total"), snap, SizeUnit.GIB)
    assert total.target.free_bytes is None and total.free_now == r.free_now
    with pytest.raises(Exception, match="only 8 local GPU"):
        resolve_target(GpuChoice(kind="local", device="6", count=9), snap, SizeUnit.GIB)
