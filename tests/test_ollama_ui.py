"""The window reads the new run fields from their declarations: Ollama's version and llama.cpp's --fit."""

from __future__ import annotations

import pytest

from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.ui.run_form import RunForm

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

RUNS = [
    InferenceRun(engine="ollama", weights="gguf-Q4_K_M", ollama_version="0.30+", fit_target_mib=2048),
    InferenceRun(engine="ollama", weights="gguf-Q4_K_M", num_batch=1024),
    InferenceRun(engine="llama.cpp", weights="gguf-Q4_K_M", fit="on", fit_target_mib=512),
]


@pytest.fixture
def form(qtbot) -> RunForm:
    f = RunForm()
    qtbot.addWidget(f)
    return f


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.engine}-{r.ollama_version}-{r.fit}")
def test_round_trip(form: RunForm, qtbot, run: InferenceRun) -> None:
    with qtbot.assertNotEmitted(form.changed):
        form.set_value(run)
    assert form.value() == run


def test_the_version_field_is_in_the_ollama_group(form: RunForm) -> None:
    form.show()
    engine = form.widget("engine")
    engine.setCurrentIndex(engine.findData("ollama"))
    version = form.widget("ollama_version")
    assert form.groups["Ollama"].isVisible() and version.isVisible()
    version.setCurrentIndex(version.findData("0.30+"))
    assert form.value().ollama_version == "0.30+"
    engine.setCurrentIndex(engine.findData("llama.cpp"))
    assert form.widget("fit").isVisible() and not version.isVisible()
