"""Issue 30 item 2: what a training estimate works out from the model and the run's shape alone (not its
micro-batch, sequence or accumulation) is kept per shape; a point after a change of any shape field gives the
answer a cold estimate (no tape, no memo, no cache) gives, to the byte."""

from __future__ import annotations

import json
import re

import pytest

from gpumem_gui.core import estimate_document
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay import step_tape
from gpumem_gui.core.training import checks, estimate_training, make_training_run, rank
from gpumem_gui.core.training.unused import unused_notes
from tests.conftest import REPO

CONFIG = REPO / "tests" / "reference" / "extra" / "configs" / "EleutherAI__pythia-160m.json"


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return spec_from_config(json.loads(CONFIG.read_text()), name="pythia-160m")


def _cold() -> None:
    step_tape.clear()
    rank._simulate_cached.cache_clear()
    checks._adapter_checks.cache_clear()
    checks._unused_notes.cache_clear()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(step_tape, "REPLAYED_FIRST", 0)  # every point after the first off a tape
    _cold()
    yield
    _cold()


def _doc(spec, run) -> str:  # type: ignore[no-untyped-def]
    try:
        est = estimate_training(spec, run)
    except GpumemInputError as e:
        return f"error: {e}"
    return json.dumps(estimate_document("pythia-160m", None, run, est), sort_keys=True)


def test_adapter_checks_are_kept_per_shape_not_per_point(spec) -> None:  # type: ignore[no-untyped-def]
    base = make_training_run(method="lora", batch=2, seq=128)
    estimate_training(spec, base)
    for upd in ({"seq": 200}, {"batch": 3}, {"grad_accum": 4}):  # the same shape at other points
        before = checks._adapter_checks.cache_info()
        estimate_training(spec, base.model_copy(update=upd))
        after = checks._adapter_checks.cache_info()
        assert (after.hits, after.misses) == (before.hits + 1, before.misses), upd
    # a shape field changed after those points: its own checks (pythia's hidden size is 768)
    wide = make_training_run(method="lora", batch=2, seq=128, lora_rank=1024)
    warned = estimate_training(spec, wide).warnings
    assert any(w.startswith("lora_rank: 1024 exceeds the smallest") for w in warned)
    assert not any(w.startswith("lora_rank") for w in estimate_training(spec, base).warnings)


# points and shape changes in one order: each estimate warm (tapes, memo and caches of the points before it)
# and cold must be the same document
WALK = [
    {"method": "lora", "seq": 128},
    {"method": "lora", "seq": 136},
    {"method": "lora", "seq": 136, "lora_rank": 1024},
    {"method": "lora", "seq": 144, "lora_rank": 1024, "batch": 3},
    {"method": "lora", "seq": 144, "lora_targets": ["query_key_value"]},
    {"method": "lora", "seq": 152, "lora_dropout": 0.1, "grad_ckpt": True},
    {"method": "lora", "seq": 152, "precision": "megatron-bf16"},  # refused: a full fine-tuning regime
    {"method": "full", "seq": 152},
    {"method": "full", "seq": 160, "grad_accum": 3},
    {"method": "full", "seq": 160, "grad_accum": 3, "pp_schedule": "gpipe"},  # unused: a note
    {"method": "full", "seq": 160, "zero": 2, "dp": 2},
    {"method": "full", "seq": 168, "zero": 2, "dp": 2, "optimizer": "adamw-8bit"},
    {"method": "full", "seq": 168, "fsdp": "full_shard", "dp": 4, "precision": "mp-bf16"},
    {"method": "full", "seq": 176, "fsdp": "full_shard", "dp": 4, "precision": "mp-bf16", "batch": 2},
]


def test_a_walk_of_points_and_shape_changes_answers_as_cold_estimates(spec) -> None:  # type: ignore[no-untyped-def]
    warm = [_doc(spec, make_training_run(**fields)) for fields in WALK]
    cold = []
    for fields in WALK:
        _cold()
        cold.append(_doc(spec, make_training_run(**fields)))
    assert any(d.startswith("error") for d in cold) and step_tape.STATS["evaluated"] > 0
    assert "pp_schedule: 'gpipe' applies to" in json.loads(cold[9])["warnings"][0]
    assert not any("pp_schedule" in w for w in json.loads(cold[8])["warnings"])
    for fields, w, c in zip(WALK, warm, cold, strict=True):
        assert w == c, fields


@pytest.mark.parametrize("fields", [f for f in WALK if f["method"] == "lora"])
def test_the_adapter_checks_read_the_run_as_it_is(spec, fields) -> None:  # type: ignore[no-untyped-def]
    """The kept checks (run with its point fields set to 1) are those of the run itself."""
    run = make_training_run(**fields)
    try:
        direct = list(checks._adapter_checks.__wrapped__(spec, run))
    except GpumemInputError as e:
        with pytest.raises(GpumemInputError, match=re.escape(str(e.args[0])[:40])):
            checks._check_adapters(spec, run)
        return
    assert checks._check_adapters(spec, run) == direct


def test_a_sequence_sweep_records_its_shapes_tape_at_its_first_point(spec, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Within many_points (a sequence sweep, the fit's sequence search) a new shape records its tape at its
    first point instead of replaying the first ones; the points are the replay's."""
    from gpumem_gui.core.fit.sweep import sweep

    monkeypatch.setattr(step_tape, "REPLAYED_FIRST", 2)
    run = make_training_run(method="lora", batch=2, seq=128)
    xs = [96, 128, 160, 192]
    step_tape.STATS.clear()
    taped = sweep(spec, run, "seq", xs)
    assert step_tape.STATS["recorded"] == 1 and step_tape.STATS["replayed"] == 0
    assert step_tape.STATS["evaluated"] == len(xs)
    _cold()
    monkeypatch.setattr(step_tape, "TAPES_ON", False)
    assert sweep(spec, run, "seq", xs) == taped
    # outside it, the first points of a new shape are replayed as before
    monkeypatch.setattr(step_tape, "TAPES_ON", True)
    _cold()
    step_tape.STATS.clear()
    for s in xs[:2]:
        estimate_training(spec, run.model_copy(update={"seq": s}))
    assert step_tape.STATS["replayed"] == 2 and step_tape.STATS["recorded"] == 0


@pytest.mark.parametrize("fields", WALK)
def test_the_unused_notes_read_the_run_as_it_is(fields) -> None:  # type: ignore[no-untyped-def]
    run = make_training_run(**fields)
    assert checks._unused_notes(run.model_copy(update=checks.POINT_FREE)) == tuple(unused_notes(run))
