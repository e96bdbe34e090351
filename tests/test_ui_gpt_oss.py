"""The window opens a checkpoint published quantized (gpt-oss's MXFP4 experts) from its config.json alone with
the format its quantization_config names, and shows the window's estimate of it (issue 14 items 1 and 3)."""

from __future__ import annotations

import pytest

from gpumem_gui.ui.main_window import MainWindow
from tests.conftest import REPO

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

CONFIG = REPO / "tests" / "reference" / "extra" / "configs" / "openai__gpt-oss-20b.json"


def test_a_quantized_config_opens_in_its_published_format(main_window: MainWindow) -> None:
    assert main_window.load_source(str(CONFIG))
    assert main_window.model is not None and main_window.model.spec is not None
    assert main_window.run_form.value().weights == "mxfp4-moe"
    est = main_window.estimate
    assert est is not None
    weights = est.component("weights")
    assert weights is not None and "mxfp4-moe" in weights.label
    assert round(weights.bytes / 2**30, 1) == 12.8  # the model card's checkpoint size (arXiv:2508.10925)


def _pick_weights(window: MainWindow, fmt: str) -> None:
    box = window.run_form.widget("weights")
    box.setCurrentIndex(box.findData(fmt))


def test_the_next_model_gets_back_the_format_chosen_before(main_window: MainWindow) -> None:
    """The published format belongs to that checkpoint: the next model without one (an encoder-decoder that
    only runs unquantized, here) returns to the format the user had, and a format the user picked stays."""
    _pick_weights(main_window, "fp32")
    assert main_window.run_form.value().weights == "fp32"
    assert main_window.load_source(str(CONFIG))
    assert main_window.run_form.value().weights == "mxfp4-moe"
    assert main_window.load_source("facebook/bart-base")
    main_window.flush_background()
    assert main_window.run_form.value().weights == "fp32"
    est = main_window.estimate
    assert est is not None and est.facts["params_total"] == 139_420_416  # BART's, not gpt-oss's

    main_window.load_source(str(CONFIG))
    _pick_weights(main_window, "int8")  # the user's own choice after opening
    main_window.load_source("Qwen/Qwen3-8B")
    assert main_window.run_form.value().weights == "int8"
