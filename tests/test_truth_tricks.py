"""The framework tricks' estimate against PyTorch's MemTracker (tests/reference/distributed/tricks.json,
made by validation/truth_tricks.py): every phase peak and the offloaded activations' host RAM within 3 %,
and one point traced again live when torch is installed."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import load_model, make_training_run
from gpumem_gui.core.training.rank import simulate_rank
from tests.conftest import REPO, reference_dir

DOC = json.loads((REPO / "tests" / "reference" / "distributed" / "tricks.json").read_text())
GOAL = 0.03


def _estimate(point: dict) -> tuple[dict[str, int], int]:
    spec = load_model(str(reference_dir() / "configs" / f"{point['model']}.json")).spec
    res, _, _ = simulate_rank(spec, make_training_run(**point["run"]), 0, cpu_dropout=True)
    return {k: v.total for k, v in res.phases.items()}, res.host_bytes


@pytest.mark.parametrize("point", DOC["points"], ids=lambda p: f"{p['model']}-{p['case']}")
def test_trick_within_goal_of_the_trace(point: dict) -> None:
    est, host = _estimate(point)
    for phase, traced in point["traced"].items():
        assert abs(est[phase] - traced) <= GOAL * traced, (phase, est[phase], traced)
    assert abs(host - point["traced_host_bytes"]) <= GOAL * max(point["traced_host_bytes"], 1)


def test_every_traced_trick_is_covered_for_two_models() -> None:
    cases = {p["case"] for p in DOC["points"]}
    models = {p["model"] for p in DOC["points"]}
    assert len(models) >= 2
    for key in ("loss", "optimizer_in_backward", "activation_offload", "ckpt_every", "ckpt_policy"):
        assert any(key in p["run"] for p in DOC["points"]), key
    for case in cases:
        assert {p["model"] for p in DOC["points"] if p["case"] == case} == models


def test_a_trick_point_traced_live() -> None:
    """The worker measures a chunked loss with offloaded activations as the estimate says (torch needed)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpumem_gui.trace.request import make_request
    from gpumem_gui.trace.runner import run_in_process

    model = load_model(str(reference_dir() / "configs" / "Qwen__Qwen2.5-0.5B.json"))
    fields = {"method": "lora", "batch": 1, "seq": 256, "framework": "torchtune", "activation_offload": True}
    request = make_request(model, make_training_run(**fields))
    traced = run_in_process(request)  # the product's in-process path (the model code's warnings ignored)
    est, host = _estimate({"model": "Qwen__Qwen2.5-0.5B", "run": fields})
    for phase in ("forward", "backward", "optimizer"):
        t = traced["phases"][phase]["Total"]
        assert abs(est[phase] - t) <= GOAL * t, (phase, est[phase], t)
    assert host == traced["host_bytes"] > 0
