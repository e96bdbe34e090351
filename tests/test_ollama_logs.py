"""Ollama against published server logs (validation/data/engine_logs/ollama.json): Ollama's own prediction
(``layers.offload``, ``memory.required.*``, ``memory.graph.*``) and llama.cpp's buffers under Ollama.

Goal (issue 16): median within 3 %, worst within 15 %; the layer counts exact. A figure Ollama prints with one
decimal (``3.7 GiB``) also counts as matched when ours rounds to it.
"""

from __future__ import annotations

import statistics

import pytest

from gpumem_gui.core.units import MiB
from validation.validate_report.engine_logs import document, engine_rows, ollama_estimate, ollama_ours

ROWS = engine_rows("Ollama")  # the comparison section (i) of docs/validation.md shows


def _points() -> list[dict]:
    return document("Ollama")["points"]


@pytest.mark.parametrize("point", _points(), ids=lambda p: p["id"])
def test_layer_counts_exact(point: dict) -> None:
    est = ollama_estimate(point["id"])
    for m in point["metrics"]:
        if m["kind"] == "ollama_layers":
            assert ollama_ours(est, "ollama_layers") == m["value"], est.facts["offloaded"]


def test_multi_gpu_split_exact() -> None:
    """Several GPUs: the layers Ollama puts on each (``layers.split``, its --tensor-split) exactly."""
    split = [p for p in _points() if "split" in p]
    assert split, "a published multi-GPU log"
    for p in split:
        est = ollama_estimate(p["id"])
        assert est.facts["ollama_split"] == p["split"], p["id"]
        assert len(est.per_gpu) == len(p["split"].split(",")), p["id"]


def test_published_logs_median_3_worst_15_percent() -> None:
    """The error counts 0 where ours rounds to the figure the log printed (``LogRow.err``)."""
    rows = [r for r in ROWS if r.metric != "ollama_layers"]
    errs = [abs(r.err) for r in rows]
    worst = max(rows, key=lambda r: abs(r.err))
    assert len(rows) >= 20
    assert statistics.median(errs) <= 0.03, f"median {statistics.median(errs):.2%}"
    assert abs(worst.err) <= 0.15, f"worst {worst.err:.2%} at {worst.point} {worst.metric}"


def test_exact_buffers_are_exact() -> None:
    """llama.cpp's model, host and KV buffers under Ollama follow from the GGUF layout: to the MiB digit."""
    for r in ROWS:
        if r.metric in ("llamacpp_model", "llamacpp_host", "llamacpp_kv"):
            o, v = r.ours * r.scale, r.published * r.scale
            assert abs(o - v) <= 0.005 * MiB + 1, (r.point, r.metric, o / MiB, v / MiB)
