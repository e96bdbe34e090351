"""Issue 14: the window opens every catalog checkpoint of the model types the issue added (each read from its
catalog entry, estimated, and its parameter count the exact one the catalog checked; DeepSeek-V4 too, its
forward replayed by the transformers engine)."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.readers.catalog import resources_dir
from gpumem_gui.core.readers.new_types import NEW_READERS
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.ui.main_window import MainWindow


def _catalog_new_types() -> set[str]:
    """The new model types the shipped catalog holds a checkpoint of, read from the catalog file itself."""
    entries = json.loads((resources_dir() / "models.json").read_text(encoding="utf-8"))["models"]
    return {e["spec"]["model_type"] for e in entries} & set(NEW_READERS)


@pytest.mark.no_qt_log
def test_the_window_opens_every_new_type_checkpoint(main_window: MainWindow) -> None:
    # from the default settings (a 4,096-token prompt; BART's learned positions stop at 1,024: the window caps
    # both lengths when it opens one)
    panel = main_window.model_panel
    opened: set[str] = set()
    for model_id in panel.visible_catalog_ids():
        panel.load_source(model_id)
        main_window.flush_background()
        model = main_window.model
        assert model is not None and model.source == model_id
        if model.spec.model_type not in NEW_READERS:
            continue
        est = main_window.estimate
        assert est is not None, model_id
        assert est.facts["params_total"] == count_params(model.spec).total, model_id
        opened.add(model.spec.model_type)
    expected = _catalog_new_types()
    assert len(expected) >= 40  # the catalog file itself was read, not an empty set
    assert opened == expected, sorted(expected ^ opened)
