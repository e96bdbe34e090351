"""validation/published_training.py and its data file: every published point names its source, quote,
measured statistic and bytes; the script runs on the shipped file and reports each point (estimated or
"not yet estimable"). Accuracy is not tested here: it is reported in docs/validation-training.md."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "validation" / "published_training.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_training_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


pt = _load()


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    return pt.load_data()


def test_every_point_has_source_quote_kind_and_bytes(data: dict[str, Any]) -> None:
    points = data["points"]
    assert len(points) >= 30
    for p in points:
        assert p["source"].startswith("https://"), p["id"]
        assert p["quote"].strip(), p["id"]
        m = p["measured"]
        assert m["kind"] in pt.KINDS, p["id"]
        assert isinstance(m["bytes"], int) and m["bytes"] > 0, p["id"]
        assert m["bytes"] == round(m["value"] * pt.UNITS[m["unit_assumed"]]), p["id"]
        for u in p["unmodelled"]:
            assert u["what"] and u["why"], p["id"]


def test_every_group_has_a_title_and_points_from_three_frameworks(data: dict[str, Any]) -> None:
    groups = {p["group"] for p in data["points"]}
    assert groups <= set(pt.GROUP_TITLES)
    assert len(groups) >= 3


def test_every_model_is_in_the_catalog_or_a_shipped_config(data: dict[str, Any]) -> None:
    from gpumem_gui.core.readers.catalog import find_model

    for p in data["points"]:
        if p["model"].endswith(".json"):
            assert (REPO / p["model"]).is_file(), p["id"]
        else:
            assert find_model(p["model"]) is not None, p["id"]


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "points.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda p: p.pop("quote"), "missing 'quote'"),
        (lambda p: p.update(source=" "), "empty source or quote"),
        (lambda p: p["measured"].update(kind="smi"), "measured.kind: 'smi' is not one of"),
        (lambda p: p["measured"].update(bytes=p["measured"]["bytes"] + 1), "measured.bytes"),
        (lambda p: p["measured"].update(unit_assumed="TB"), "unit_assumed: 'TB'"),
        (lambda p: p.update(reason=" "), "reason: an explanation in words"),
    ],
    ids=["no-quote", "blank-source", "bad-kind", "bytes-off", "bad-unit", "blank-reason"],
)
def test_a_broken_point_is_one_line_naming_it(tmp_path: Path, data: dict[str, Any], edit, words: str) -> None:  # type: ignore[no-untyped-def]
    broken = copy.deepcopy(data)
    edit(broken["points"][0])
    with pytest.raises(pt.PointError, match=r"points\[0\] \(" + broken["points"][0]["id"]) as e:
        pt.load_data(_write(tmp_path, broken))
    assert words in str(e.value)


def test_the_script_runs_on_the_shipped_file(tmp_path: Path, data: dict[str, Any]) -> None:
    doc, result = tmp_path / "doc.md", tmp_path / "result.json"
    assert pt.main(["--doc", str(doc), "--result", str(result)]) == 0
    out = json.loads(result.read_text(encoding="utf-8"))
    assert [o["id"] for o in out["points"]] == [p["id"] for p in data["points"]]
    by_id = {p["id"]: p for p in data["points"]}
    text = doc.read_text(encoding="utf-8")
    for o in out["points"]:
        assert o["id"] in text
        if o["error"] is None:
            assert o["status"].startswith("not yet estimable: "), o["id"]
        else:
            assert o["ours_bytes"] > 0 and o["status"] == "estimated"
            assert (abs(o["error"]) > pt.THRESHOLD) == bool(o["reason"]), o["id"]
            own = by_id[o["id"]].get("reason")
            if o["reason"] and own:  # a point's own sourced reason is shown with the generated one
                assert "why: " + own in o["reason"], o["id"]
    assert set(out["summary"]) == {p["group"] for p in data["points"]} | {"all"}


def test_a_run_the_core_rejects_is_reported_not_dropped(tmp_path: Path, data: dict[str, Any]) -> None:
    small = copy.deepcopy(data)
    small["points"] = small["points"][:2]
    small["points"][1]["run"] = {**small["points"][1]["run"], "zero": 3, "fsdp": "full_shard"}
    doc, result = tmp_path / "doc.md", tmp_path / "result.json"
    points = _write(tmp_path, small)
    assert pt.main(["--points", str(points), "--doc", str(doc), "--result", str(result)]) == 0
    rows = json.loads(result.read_text(encoding="utf-8"))["points"]
    assert len(rows) == 2
    assert rows[1]["status"].startswith("not yet estimable: ") and "fsdp" in rows[1]["status"]
    assert rows[1]["status"] in doc.read_text(encoding="utf-8")


def test_ours_compares_like_with_like() -> None:
    from gpumem_gui.core.readers.loader import load_model
    from gpumem_gui.core.training import estimate_training, make_training_run

    spec = load_model("Qwen/Qwen2.5-0.5B").spec
    est = estimate_training(spec, make_training_run(batch=1, seq=256, allocator_model=True))
    ctx, ws = est.component("cuda_context"), est.component("workspace")
    assert ctx is not None and ctx.bytes > 0 and ws is not None
    assert pt.ours_for("allocated", est) == pt.ours_for("active", est) == est.peak_bytes
    # the allocator model (--allocator-model, as the comparison runs reserved figures): its reserved peak
    # (max_memory_reserved on a GPU with room) and the workspace; nvidia-smi adds the context (every cached
    # block stays reserved)
    reserved = max(ph.reserved_bytes or 0 for ph in est.phases.values())
    assert reserved == est.facts["reserved_peak_bytes"] > est.peak_bytes
    assert pt.ours_for("reserved", est) == reserved + ws.bytes
    assert pt.ours_for("nvidia-smi", est) == reserved + ws.bytes + ctx.bytes
    # off: the flat reserve on the total
    flat = estimate_training(spec, make_training_run(batch=1, seq=256))
    assert pt.ours_for("nvidia-smi", flat) == flat.total_bytes
    assert pt.ours_for("reserved", flat) == flat.total_bytes - ctx.bytes
