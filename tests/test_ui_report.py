"""The export helpers (no Qt): command lines, runtime flags, Markdown, atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpumem_gui.core.fit import GpuTarget, fit_report
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.runtimes.inference import InferenceRun, estimate_inference
from gpumem_gui.core.units import SizeUnit
from gpumem_gui.files import atomic_write
from gpumem_gui.ui.report import cli_command, markdown_report, plan_document, runtime_flags


@pytest.fixture(scope="module")
def llama():
    return load_model("meta-llama/Llama-3.1-8B")


def test_cli_command_names_only_what_differs(llama) -> None:
    line = cli_command(llama.source, InferenceRun(batch=4), "RTX-4090", 1)
    assert line == "gpumem estimate meta-llama/Llama-3.1-8B --weights bf16 --batch 4 --gpu RTX-4090"
    run = InferenceRun(engine="llama.cpp", weights="gguf-Q4_K_M", n_batch=4096, flash_attn=False)
    line = cli_command("/models/my model.gguf", run, None, margin_bytes=0)
    assert "'/models/my model.gguf'" in line and "--no-flash-attn" in line and "--margin-mib 0" in line
    assert "--n-batch 4096" in line


def test_runtime_flags(llama) -> None:
    run = InferenceRun(
        engine="llama.cpp", weights="gguf-Q4_K_M", batch=2, seq=4000, new_tokens=96, n_gpu_layers=20
    )
    flags = runtime_flags("llama.gguf", run, estimate_inference(llama.spec, run))
    expected = "llama-server -m llama.gguf -c 8192 -ngl 20 -ctk f16 -ctv f16 -b 2048 -ub 512 -fa on -np 2"
    note = (
        "# gpumem, not in this command: seq 4000, new_tokens 96 (each slot's context (-c / -np) is prompt +"
    )
    assert flags.splitlines() == [note + " new tokens)", expected]  # -c holds 2 x (4000 + 96)
    run = InferenceRun(attn="flash", compute_dtype="fp16")
    flags = runtime_flags("m", run, estimate_inference(llama.spec, run))
    assert "dtype=torch.float16" in flags and "attn_implementation='flash'" in flags


def test_markdown_has_the_numbers_the_verdict_and_every_explanation(llama) -> None:
    run = InferenceRun(batch=8, seq=16384)
    g = find_gpu("RTX-4090")
    rep = fit_report(llama.spec, run, GpuTarget(name=g.id, capacity_bytes=g.memory_bytes))
    est = rep.estimate
    md = markdown_report(
        llama, run, est, rep, unit=SizeUnit.GB, target_text="1 x RTX 4090", command="gpumem ...", flags="x"
    )
    assert "## Verdict: does not fit" in md and "misses by" in md and "### To make it fit" in md
    assert f"{est.total_bytes:,}" in md and "| GB |" in md
    for c in est.components:
        assert c.explain.formula in md and f"(`{c.key}`)" in md
    doc = plan_document(llama, run, est, rep)
    assert doc["schema"] == "gpumem.estimate/1" and doc["fit"]["fits"] is False


def test_atomic_write_replaces_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    atomic_write(target, "one")
    atomic_write(target, b"two")
    assert target.read_text() == "two"
    assert os.listdir(tmp_path) == ["a.txt"]
    with pytest.raises(OSError):
        atomic_write(tmp_path / "missing" / "b.txt", "x")
    assert os.listdir(tmp_path) == ["a.txt"]
