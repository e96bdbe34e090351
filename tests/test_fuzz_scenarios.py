"""Fuzz: fake-GPU scenario files (``hardware.load_scenario`` + a few snapshots) and the window's saved
scenario files (``ui.scenario.scenario_from_json`` / ``read_scenario``).

A fake-GPU scenario is a scenario or one GpumemInputError, and a loaded one snapshots without raising
(whatever ``CUDA_VISIBLE_DEVICES`` says); a window scenario is a scenario or one ``ScenarioError``
(tests/fuzz_strategies.py states the property). Inputs: the shipped scenarios and saved window scenarios,
mutated as documents and as JSON text.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpumem_gui.core import TrainingRun
from gpumem_gui.hardware import FakeBackend, load_scenario
from gpumem_gui.ui.scenario import ModelRef, Scenario, ScenarioError, read_scenario, scenario_from_json
from gpumem_gui.ui.target_form import GpuChoice
from tests.conftest import REPO
from tests.fuzz_strategies import (
    DEEP_DICT,
    DEEP_LIST,
    HUGE_INT,
    accepted_or_refused,
    check_refusal,
    documents,
    fuzz_settings,
    passing_over_known_bugs,
    values_in,
)

FAKE = [json.loads(p.read_text()) for p in sorted((REPO / "resources" / "fake_gpus").glob("*.json"))]


def _keys(doc: Any) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in _keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _keys(v)}
    return set()


FAKE_KEYS = sorted(set().union(*(_keys(d) for d in FAKE)))
CVD = st.none() | st.sampled_from(["", "0", "1,0", "-1", "GPU-0", "0,0", "MIG-x", "9" * 5000, "0," * 3000])
FAKE_REPRODUCERS = [
    '{"version": 1, "gpus": [{"name": "x", "total_mib": ' + HUGE_INT + "}]}",
    '{"version": 1, "gpus": ' + DEEP_LIST + "}",
    '{"version": 1, "x": ' + DEEP_DICT + "}",
    json.dumps({**FAKE[0], "gpus": FAKE[0]["gpus"] * 4097}),  # more GPUs than anything has (MAX_GPUS 4,096)
]


def check_fake_gpus(text: str, cvd: str | None, steps: int) -> None:
    values = values_in(text) + ([cvd] if cvd and len(cvd) > 80 else [])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "scenario.json"
        path.write_text(text, encoding="utf-8")
        if accepted_or_refused(lambda: load_scenario(path), values) is None:
            return
        backend = accepted_or_refused(lambda: FakeBackend(path, cuda_visible_devices=cvd), values)
        if backend is None:
            return
        try:
            for _ in range(steps):
                snap = backend.snapshot()
                if not snap.available:
                    check_refusal(ValueError(snap.unavailable_reason or "unavailable"), values)
        finally:
            backend.close()


@fuzz_settings(120)
@given(text=documents(FAKE, FAKE_KEYS), cvd=CVD, steps=st.integers(1, 6))
@example(text=FAKE_REPRODUCERS[0], cvd=None, steps=1)
@example(text=FAKE_REPRODUCERS[1], cvd=None, steps=1)
@example(text=FAKE_REPRODUCERS[2], cvd=None, steps=1)
@example(text=FAKE_REPRODUCERS[3], cvd=None, steps=1)
def test_fake_gpu_scenario_is_a_scenario_or_one_line(text: str, cvd: str | None, steps: int) -> None:
    with passing_over_known_bugs():
        check_fake_gpus(text, cvd, steps)


def _with_empty_series(at_end: str) -> str:
    doc = json.loads(json.dumps(FAKE[0]))
    doc["at_end"] = at_end
    doc["gpus"][0]["temperature_c"] = []
    return json.dumps(doc)


@pytest.mark.parametrize("at_end", ["cycle", "hold"])
def test_found_empty_fake_gpu_series(at_end: str) -> None:
    """Found by this suite: an empty reading series passed validation, then a snapshot raised
    ZeroDivisionError (at_end 'cycle') or IndexError ('hold') in hardware/fake.py."""
    check_fake_gpus(_with_empty_series(at_end), None, 2)


def test_found_cuda_visible_devices_with_a_huge_index() -> None:
    check_fake_gpus(json.dumps(FAKE[0]), "9" * 5000, 1)


def test_found_long_reserved_mib_is_clipped() -> None:
    doc = json.loads(json.dumps(FAKE[0]))
    doc["gpus"][0]["reserved_mib"] = 10**400
    check_fake_gpus(json.dumps(doc), None, 1)


# ---- the window's scenario files ----------------------------------------------------------------------

WINDOW = [
    json.loads(Scenario(model=ModelRef(source="Llama-3.1-8B")).to_json()),
    json.loads(
        Scenario(
            model=ModelRef(source="Qwen3-30B-A3B"),
            mode="train",
            training=TrainingRun(),
            gpu=GpuChoice(kind="catalog", gpu_id="H100-SXM-80GB", count=8),
        ).to_json()
    ),
    json.loads(Scenario(model=ModelRef(source="x"), gpu=GpuChoice(kind="local", device="0")).to_json()),
]
WINDOW_KEYS = sorted(set().union(*(_keys(d) for d in WINDOW)))
WINDOW_REPRODUCERS = [
    json.dumps(WINDOW[0]).replace('"batch": 1', '"batch": ' + HUGE_INT),
    json.dumps(WINDOW[0])[:-1] + ', "x": ' + DEEP_LIST + "}",
    json.dumps({**WINDOW[0], "gpu": {**WINDOW[0]["gpu"], "margin_mib": -1_000_000}}),
    json.dumps({**WINDOW[0], "gpu": {**WINDOW[0]["gpu"], "count": 4097}}),
    json.dumps({**WINDOW[0], "model": {"source": "x" * 100_000}}),
]


@fuzz_settings(300)
@given(text=documents(WINDOW, WINDOW_KEYS))
@example(text=WINDOW_REPRODUCERS[0])
@example(text=WINDOW_REPRODUCERS[1])
@example(text=WINDOW_REPRODUCERS[2])
@example(text=WINDOW_REPRODUCERS[3])
@example(text=WINDOW_REPRODUCERS[4])
def test_window_scenario_is_a_scenario_or_one_line(text: str) -> None:
    with passing_over_known_bugs():
        check_window_scenario(text)


def check_window_scenario(text: str) -> None:
    values = values_in(text)
    sc = accepted_or_refused(lambda: scenario_from_json(text, "fuzz.gpumem.json"), values, ScenarioError)
    if sc is not None:  # what was accepted saves and reads back the same
        assert scenario_from_json(sc.to_json()) == sc
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.gpumem.json"
        path.write_text(text, encoding="utf-8")
        again = accepted_or_refused(lambda: read_scenario(path), values, ScenarioError)
        assert (again is None) == (sc is None)


def test_found_long_lora_target_is_clipped() -> None:
    doc = json.loads(json.dumps(WINDOW[1]))
    doc["training"] |= {"method": "lora", "lora_targets": ["x" * 5000 + "!"]}
    check_window_scenario(json.dumps(doc))
