"""The window's custom GPU (issue 18): a GPU that is not in the catalog, given by its memory in the target
form, read by the same core parser as the CLI's ``--gpu 24GiB``."""

from __future__ import annotations

import pytest

from gpumem_gui.core import GiB, GpumemInputError, SizeUnit, gpu_target_from_text
from gpumem_gui.ui.target_form import GpuChoice, TargetForm, resolve_target


@pytest.fixture
def target(qtbot) -> TargetForm:
    f = TargetForm()
    qtbot.addWidget(f)
    f.show()
    return f


def _pick_custom(form: TargetForm) -> None:
    combo = form.widget("gpu")
    combo.setCurrentIndex(combo.findData("custom:"))


def test_custom_entry_shows_the_memory_field(target: TargetForm, qtbot) -> None:
    capacity = target.widget("capacity")
    assert not capacity.isVisible()  # a catalog GPU needs no memory field
    with qtbot.waitSignal(target.changed):
        _pick_custom(target)
    assert capacity.isVisible()
    with qtbot.waitSignal(target.changed):
        qtbot.keyClicks(capacity, "x")  # typed: the window waits for more keys
    assert target.typing
    capacity.setText("80GB")
    choice = target.value()
    assert (choice.kind, choice.capacity) == ("custom", "80GB")
    target.set_value(GpuChoice())
    assert not capacity.isVisible()


def test_custom_choice_round_trip(target: TargetForm, qtbot) -> None:
    choice = GpuChoice(kind="custom", capacity="23.5GiB", count=2, margin_mib=512)
    with qtbot.assertNotEmitted(target.changed):
        target.set_value(choice)
    assert target.value() == choice
    assert target.widget("capacity").isVisible()


def test_resolve_custom_target_uses_the_cli_parser() -> None:
    r = resolve_target(GpuChoice(kind="custom", capacity="23.5GiB", count=2), None, SizeUnit.GIB)
    assert r.target == gpu_target_from_text("23.5GiB:2")
    assert r.target.capacity_bytes == int(23.5 * GiB)
    assert r.text == "2 x custom 23.5 GiB GPU (23.50 GiB each as CUDA reports it)"


@pytest.mark.parametrize("text", ["", "24", "H100", "24GiB:2", "100MB", "24XB"])
def test_bad_custom_capacity_is_an_input_error(text: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        resolve_target(GpuChoice(kind="custom", capacity=text), None, SizeUnit.GIB)
    assert e.value.field == "gpu" and "\n" not in str(e.value)


def test_the_copied_command_keeps_a_custom_gpu() -> None:
    """The window's "copy command" for a custom GPU gives --gpu in the grammar the CLI reads back."""
    from gpumem_gui.core import gpu_target_from_text
    from gpumem_gui.ui.export import cli_gpu
    from gpumem_gui.ui.target_form import GpuChoice

    gpu, count = cli_gpu(GpuChoice(kind="custom", capacity=" 23.5 GiB ", count=2), None)
    assert (gpu, count) == ("23.5GiB", 2)
    target = gpu_target_from_text(f"{gpu}:{count}")
    assert target.capacity_bytes == int(23.5 * 2**30) and target.count == 2
