"""Issue 31 item 1: the allocator model's speed work changes no byte of its answers. The event streams of six
small training steps (one GPU, FSDP2, ZeRO-2/3, QLoRA, checkpointing) and the reports the full simulation gave
on them before the speed work (tests/reference/allocator/reports.json, recorded at gpumem commit 1b01636):
every setting of ``PYTORCH_CUDA_ALLOC_CONF`` the model reads, one step and the steady state, a GPU with room
and GPUs too small for the cache (the release-and-retry path, out of memory)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from gpumem_gui.core.allocator import ALLOC, FREE, GROW, PHASE, Event, parse_alloc_conf, run_events
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "reference" / "allocator" / "reports.json"
_OPS = {"A": ALLOC, "F": FREE, "G": GROW}


@cache
def _doc() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


@cache
def _events(name: str) -> tuple[Event, ...]:
    s = _doc()["streams"][name]
    keys, sizes, size_of, phases = iter(s["keys"]), s["sizes"], iter(s["size_of"]), iter(s["phases"])
    return tuple(
        (PHASE, next(phases), 0) if op == "P" else (_OPS[op], next(keys), sizes[next(size_of)])
        for op in s["ops"]
    )


def _case_ids() -> list[str]:
    return [
        f"{c['stream']}|{c['alloc_conf'] or 'default'}|steps{c['steps']}|cap{c['capacity']}"
        for c in _doc()["cases"]
    ]


@pytest.mark.parametrize("index", range(len(_doc()["cases"])), ids=_case_ids())
def test_the_report_is_the_full_simulations_to_the_byte(index: int) -> None:
    case = _doc()["cases"][index]
    rep = run_events(
        _events(case["stream"]),
        parse_alloc_conf(case["alloc_conf"]),
        steps=case["steps"],
        capacity=case["capacity"],
    )
    assert rep.model_dump(mode="json", exclude={"config"}) == case["report"]


def test_the_fixture_covers_the_paths_that_matter() -> None:
    """The recorded cases go through the paths the speed work touches: splits and merges in both pools,
    released cached segments (retries), out of memory, and expandable segments."""
    reports = [c["report"] for c in _doc()["cases"]]
    assert any(r["retries"] > 0 and not r["oom"] for r in reports)
    assert any(r["oom"] for r in reports)
    assert any(r["fragmentation"] > 0.05 for r in reports)
    assert {c["alloc_conf"] for c in _doc()["cases"]} >= {
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
    }
