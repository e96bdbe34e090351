"""The window's Edit > Paste command… takes a quantized checkpoint's format as the CLI does: with or without
``--dtype`` the weights stay in the format the checkpoint is published in (tests/test_imports_dtype.py)."""

from __future__ import annotations

import pytest

from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]


@pytest.mark.parametrize("dtype", ["", " --dtype bfloat16"])
def test_paste_keeps_a_quantized_checkpoints_format(main_window: MainWindow, qtbot, dtype: str) -> None:
    w = main_window
    assert w.imports.apply_command(f"vllm serve openai/gpt-oss-20b --max-model-len 8192{dtype}")
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "openai/gpt-oss-20b", timeout=5000)
    qtbot.waitUntil(lambda: w.estimate is not None, timeout=5000)
    assert (w.run.engine, w.run.weights, w.run.compute_dtype) == ("vllm", "mxfp4-moe", "bf16")


def test_paste_dtype_casts_an_unquantized_checkpoint(main_window: MainWindow, qtbot) -> None:
    w = main_window
    assert w.imports.apply_command("vllm serve Qwen/Qwen3-8B --max-model-len 8192 --dtype float32")
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "Qwen/Qwen3-8B", timeout=5000)
    assert (w.run.weights, w.run.compute_dtype) == ("fp32", "fp32")
