"""Fuzz: the readers of what a GPU said (gpumem_gui.core.observed) on generated text and bytes.

The published reports of tests/reference/observed/ cut anywhere, their numbers replaced by huge, negative
or malformed ones, their units by odd ones, lines duplicated and interleaved; random text; random bytes and
pickle-looking bytes. The property: an :class:`ObservedReport` whose records hold only the figures the
model allows, or one :class:`GpumemInputError` line (no other exception, no newline, at most ~80
characters of any value echoed), quickly. Pathological inputs at the size bound (megabytes of one repeated
prefix) must be read in seconds.
"""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpumem_gui.core import GpumemInputError, ObservedReport, read_observed, read_observed_bytes
from tests.fuzz_strategies import check_refusal, fuzz_settings

DIR = Path(__file__).parent / "reference" / "observed"
FIXTURES = sorted(p.read_text(encoding="utf-8") for p in DIR.glob("*.txt"))
NUMBERS = [
    "0",
    "-1",
    "-0.00",
    "9" * 60,
    "1" + "0" * 400,
    "1e999",
    "NaN",
    "inf",
    "0x10",
    "١٢",
    "²",
    "3.",
    ".5",
]
UNITS = ["GiB", "MiB", "KiB", "bytes", "B", "GB", "MB", "TiB", "PiB", "EiB", "gib", "", "%", "GiBGiB"]
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_UNIT = re.compile(r"\b(?:GiB|MiB|KiB|bytes|GB|MB|KB)\b")


def _check(call: Any, values: list[str]) -> None:
    start = time.monotonic()
    try:
        report = call()
    except GpumemInputError as e:
        check_refusal(e, values)
    else:
        assert isinstance(report, ObservedReport) and report.records
        for record in report.records:
            assert all(0 <= v <= 1 << 60 for v in record.stated().values())
            assert all("\n" not in line for line in record.unread)
    assert time.monotonic() - start < 5, "reading took over 5 s"


@fuzz_settings(120)
@given(
    base=st.sampled_from(FIXTURES),
    cut=st.tuples(st.integers(0, 5000), st.integers(0, 5000)),
    numbers=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(NUMBERS)), max_size=4),
    units=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(UNITS)), max_size=3),
    repeat=st.integers(1, 3),
)
def test_published_reports_mutated(
    base: str, cut: tuple[int, int], numbers: list[tuple[int, str]], units: list[tuple[int, str]], repeat: int
) -> None:
    text = base
    for pattern, edits in ((_NUMBER, numbers), (_UNIT, units)):
        for pos, value in edits:
            spans = [m.span() for m in pattern.finditer(text)]
            if spans:
                a, b = spans[pos % len(spans)]
                text = text[:a] + value + text[b:]
    lo, hi = sorted(cut)
    text = (text[lo : hi or None] if hi > lo else text[lo:]) * repeat
    _check(lambda: read_observed(text), [text])


@fuzz_settings(100)
@given(text=st.text(max_size=400))
@example(text="CUDA out of memory. Tried to allocate ")
@example(text="| Processes: |\n|  0  N/A  N/A  1  C  x  99999999999999999999999999999MiB |")
@example(text="'allocated_bytes.all.current': -5")
@example(text="--query-gpu=memory.total --format=csv,noheader\n" + "9" * 50)
def test_random_text(text: str) -> None:
    _check(lambda: read_observed(text), [text])


@fuzz_settings(100)
@given(data=st.binary(max_size=400), magic=st.sampled_from([b"", b"\x80\x02", b"\x80\x04\x95", b"\x80\x05"]))
def test_random_bytes(data: bytes, magic: bytes) -> None:
    _check(lambda: read_observed_bytes(magic + data), [data.decode("utf-8", "replace")])


@fuzz_settings(60)
@given(
    obj=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=4),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=30,
    ),
    protocol=st.sampled_from([2, 4, 5]),
)
def test_random_pickled_documents(obj: Any, protocol: int) -> None:
    doc = {"segments": obj} if not isinstance(obj, dict) else {"segments": [obj], **obj}
    _check(lambda: read_observed_bytes(pickle.dumps(doc, protocol=protocol)), [repr(obj)])


MB = 1 << 20


@pytest.mark.parametrize(
    "text",
    [
        "CUDA out of memory. Tried to allocate " + "1" * (3 * MB),
        "CUDA out of memory. Tried to allocate 1.00 GiB. " * (MB // 16),
        ("|" + " 1" + " " * 300 + "Off |\n") * (MB // 320),
        "| Processes: |\n" + ("|  0  N/A  N/A  1  C  " + " " * 300 + "|\n") * (MB // 330),
        ("| Allocated memory" + " " * 300 + "| 1 B | 1 B |\n") * (MB // 330),
        ("Load weight end." * 200 + " GB\n") * (MB // 3300),
        "'" + "a_bytes" * (MB // 7),
        ("--query-gpu=" + "memory.total," * 30 + " --format=csv\n") * (MB // 420),
        "x" * (4 * MB),
    ],
    ids=[
        "long-number",
        "many-heads",
        "gpu-cells",
        "process-rows",
        "summary-rows",
        "sglang",
        "stats",
        "csv",
        "x",
    ],
)
def test_pathological_text_is_read_in_seconds(text: str) -> None:
    _check(lambda: read_observed(text), [text[:10_000]])
