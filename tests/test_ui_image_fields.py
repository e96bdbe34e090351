"""The Images fields (number of images, image size) are offered for models that take images only: the field
declarations name the core's predicate (core/fields.py ``UI.model``: a replayed vision tower, or for inference
cross-attention layers), the window hands the forms the opened model's spec; nothing in the window tests a
model type."""

from __future__ import annotations

import pytest

from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

TEXT = "Qwen/Qwen3-8B"
VLM = "google/gemma-3-4b-it"  # Gemma 3: the SigLIP tower is replayed (replay/vision_siglip.py)
CROSS = "meta-llama/Llama-3.2-11B-Vision-Instruct"  # cross-attention layers, no replayed tower
FIELDS = ("images", "image_size")


def _offered(w: MainWindow) -> tuple[bool, bool]:
    """(inference form, training form): whether both image fields are offered in each."""
    panel = w.run_panel
    return (
        all(panel.run_form.row_visible(f) for f in FIELDS),
        all(panel.train_form.row_visible(f) for f in FIELDS),
    )


def test_image_fields_follow_the_model_opened(main_window: MainWindow) -> None:
    w = main_window
    form = w.run_panel.run_form
    assert _offered(w) == (False, False)  # the default model (Llama-3.1-8B) is text only
    assert not any(form.row_visible(f) or w.run_panel.train_form.row_visible(f) for f in FIELDS)

    assert w.load_source(VLM)
    assert _offered(w) == (True, True)
    form.widget("images").setValue(2)
    w.recompute_now()
    assert w.session.run is not None and w.session.run.images == 2
    assert "--images 2" in w.command_line()

    assert w.load_source(TEXT)
    assert not any(form.row_visible(f) or w.run_panel.train_form.row_visible(f) for f in FIELDS)
    # a hidden image count is not the text model's: its run has none, and no warning about them
    assert w.session.run is not None and w.session.run.images == 0
    assert w.estimate is not None and not any("images" in x for x in w.estimate.warnings)
    assert "--images" not in w.command_line()

    assert w.load_source(VLM)  # the count the user chose comes back with the next model that takes images
    assert _offered(w) == (True, True)
    assert w.session.run is not None and w.session.run.images == 2


def test_cross_attention_models_take_images_in_inference_only(main_window: MainWindow) -> None:
    """Llama 3.2 Vision: transformers caches the images' vision keys and values (inference), but its tower is
    not replayed in training (training/checks.py: the images would not be counted)."""
    w = main_window
    assert w.load_source(CROSS)
    assert _offered(w) == (True, False)
