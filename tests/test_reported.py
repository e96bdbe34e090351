"""What a GPU with room would report (core/results/reported.py): max_memory_allocated, max_memory_reserved and
nvidia-smi beside the figure a fit checks, in the core, the JSON document, the CLI and the markdown report."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import estimate_training, load_model, make_run, make_training_run, reported, reported_for
from gpumem_gui.core.results.nontorch import outside_allocator_bytes
from gpumem_gui.core.runtimes.inference import estimate_inference

MODEL = "meta-llama/Llama-3.2-1B"


def _spec():  # type: ignore[no-untyped-def]
    spec = load_model(MODEL).spec
    assert spec is not None
    return spec


def test_flat_reserve_reports_the_total_as_nvidia_smi() -> None:
    est = estimate_training(_spec(), make_training_run(method="full", seq=512, batch=1))
    rep = reported(est)
    outside = outside_allocator_bytes(est.components)
    assert rep.basis == "flat reserve" and outside > 0
    assert rep.allocated_bytes == est.peak_bytes
    assert rep.nvidia_smi_bytes == est.total_bytes and rep.reserved_bytes == est.total_bytes - outside
    assert rep.explain.inputs["outside_allocator_bytes"] == outside and "flat" in rep.explain.formula


def test_allocator_model_reports_its_reserved_peak_and_workspaces() -> None:
    est = estimate_training(_spec(), make_training_run(method="full", seq=512, batch=1, allocator_model=True))
    rep = reported(est)
    peaks = [ph.reserved_bytes for ph in est.phases.values() if ph.reserved_bytes is not None]
    workspace = sum(c.bytes for c in est.components if c.key == "workspace")
    assert rep.basis == "allocator model" and peaks and workspace > 0
    assert rep.reserved_bytes == max(peaks) + workspace
    assert rep.nvidia_smi_bytes == rep.reserved_bytes + outside_allocator_bytes(est.components)
    assert rep.reserved_bytes >= rep.allocated_bytes == est.peak_bytes


@pytest.mark.parametrize(("engine", "shown"), [("transformers", True), ("vllm", False), ("llama.cpp", False)])
def test_only_estimates_of_the_caching_allocator_report_it(engine: str, shown: bool) -> None:
    est = estimate_inference(_spec(), make_run(engine=engine, seq=512), None)
    assert (reported_for(est) is not None) is shown


def test_json_and_cli_show_reserved_and_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", MODEL, "--mode", "train", "--seq", "512", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rep = doc["reported"]
    assert rep["basis"] == "flat reserve" and rep["nvidia_smi_bytes"] == doc["total_bytes"]
    assert rep["allocated_bytes"] == doc["peak_bytes"] < rep["reserved_bytes"] < rep["nvidia_smi_bytes"]
    assert main(["estimate", MODEL, "--engine", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reported"] is None
    assert main(["estimate", MODEL, "--mode", "train", "--seq", "512", "--allocator-model"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("a GPU with room:"))
    assert "torch.cuda.max_memory_reserved" in line and "nvidia-smi" in line and "(allocator model)" in line
