"""The refactoring oracle stays in force: a sample of the 4,325 recorded estimates and fits
(``tests/reference/regression``, made by ``validation/regression.py`` after issue 12) gives the same numbers
with the code as it is. A change that moves numbers on purpose regenerates the dump and says why
(``CHANGELOG.md``, "Numbers that moved", shows how)::

    python validation/regression.py dump --calls tests/reference/regression/calls.jsonl.gz \\
        --out tests/reference/regression/issue12.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from functools import cache

import pytest

from tests.conftest import REPO

DUMP = REPO / "tests" / "reference" / "regression" / "issue12.json.gz"
SAMPLE_EVERY = 25  # ~170 of the 4,325 results: a few seconds


@cache
def _dump() -> dict:
    return json.loads(gzip.open(DUMP, "rt", encoding="utf-8").read())


def _keys() -> list[str]:
    return sorted(_dump()["results"])[::SAMPLE_EVERY]


@pytest.fixture(scope="module")
def regression():
    if str(REPO / "validation") not in sys.path:  # regression.py imports its siblings from there
        sys.path.insert(0, str(REPO / "validation"))
    import regression as module

    return module


@pytest.mark.parametrize("key", _keys())
def test_recorded_estimate_gives_the_same_numbers(regression, key: str) -> None:
    want = _dump()["results"][key]
    got = regression.evaluate(_dump()["calls"][key])
    assert got.get("error") == want.get("error")
    assert got.get("numbers") == want.get("numbers"), (
        f"{want['fn']}: numbers moved (see the module docstring)"
    )
