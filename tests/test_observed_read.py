"""Issue 32 item 1: each published GPU memory report in tests/reference/observed/ read to the exact bytes.

The expected figures are written as the report prints them ("23.65 GiB") and turned into bytes here with
exact fractions (GiB = 2^30, MiB = 2^20, KiB = 2^10 as PyTorch's format_size and nvidia-smi print them), so a
wrong unit or a wrong sentence -> figure mapping fails. Each fixture's source URL is in sources.json.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from gpumem_gui.core import FIGURES, GpumemInputError, read_observed, read_observed_bytes

DIR = Path(__file__).parent / "reference" / "observed"
POW2 = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def b(text: str) -> int:
    """'23.65 GiB' -> bytes, rounded to the nearest byte (half to even, as Decimal does)."""
    number, unit = text.split()
    return round(Fraction(number) * POW2[unit])


# file -> [(source_format, gpu_index, {figure: as printed}, derived figures)], a record per report, in order
EXPECTED: dict[str, list[tuple[str, int | None, dict[str, str], set[str]]]] = {
    "torch_oom_current_pytorch16417.txt": [
        (
            "torch_oom",
            0,
            {
                "requested_bytes": "22.00 MiB",
                "total_bytes": "23.65 GiB",
                "free_bytes": "11.06 MiB",
                "process_bytes": "23.60 GiB",
                "allocated_bytes": "22.90 GiB",
                "reserved_unallocated_bytes": "194.87 MiB",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_current_vsmtrans3.txt": [
        (
            "torch_oom",
            0,
            {
                "requested_bytes": "226.00 MiB",
                "total_bytes": "15.70 GiB",
                "free_bytes": "210.38 MiB",
                "process_bytes": "15.48 GiB",
                "allocated_bytes": "14.81 GiB",
                "reserved_unallocated_bytes": "336.73 MiB",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_2023_generateu10.txt": [
        (
            "torch_oom_2023",
            0,
            {
                "requested_bytes": "496.00 MiB",
                "total_bytes": "14.75 GiB",
                "free_bytes": "235.06 MiB",
                "allocated_bytes": "14.06 GiB",
                "reserved_unallocated_bytes": "330.42 MiB",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_2023_mygirlgpt11.txt": [
        (
            "torch_oom_2023",
            0,
            {
                "requested_bytes": "32.00 MiB",
                "total_bytes": "4.00 GiB",
                "free_bytes": "41.56 MiB",
                "process_bytes": "3.44 GiB",
                "allocated_bytes": "2.58 GiB",
                "reserved_unallocated_bytes": "1.90 MiB",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_2023_ootdiffusion167.txt": [
        (
            "torch_oom_2023",
            0,
            {
                "requested_bytes": "2.00 GiB",
                "total_bytes": "4.00 GiB",
                "free_bytes": "2.80 GiB",
                "allocated_bytes": "0 bytes",
                "reserved_unallocated_bytes": "0 bytes",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_legacy_pytorch59778.txt": [
        (
            "torch_oom_legacy",
            0,
            {
                "requested_bytes": "2.26 GiB",
                "total_bytes": "6.00 GiB",
                "allocated_bytes": "781.59 MiB",
                "free_bytes": "3.03 GiB",
                "reserved_bytes": "1.24 GiB",
            },
            {"reserved_unallocated_bytes"},
        )
    ],
    "torch_oom_legacy_easydiffusion104.txt": [
        (
            "torch_oom_legacy",
            0,
            {
                "requested_bytes": "64.00 MiB",
                "total_bytes": "4.00 GiB",
                "allocated_bytes": "3.35 GiB",
                "free_bytes": "0 bytes",
                "reserved_bytes": "3.41 GiB",
            },
            {"reserved_unallocated_bytes"},
        )
    ],
    "torch_oom_cached_pytorch16417.txt": [
        (
            "torch_oom_cached",
            0,
            {
                "requested_bytes": "12.50 MiB",
                "total_bytes": "10.92 GiB",
                "allocated_bytes": "8.57 MiB",
                "free_bytes": "9.28 GiB",
                "reserved_unallocated_bytes": "4.68 MiB",
            },
            {"reserved_bytes"},
        )
    ],
    "torch_oom_cached_pytorch13751.txt": [
        (
            "torch_oom_cached",
            0,
            {
                "requested_bytes": "16.00 GiB",
                "total_bytes": "11.93 GiB",
                "allocated_bytes": "4.00 GiB",
                "free_bytes": "7.33 GiB",
                "reserved_unallocated_bytes": "179.00 KiB",
            },
            {"reserved_bytes"},
        )
    ],
}

# derived figures and the stated ones they come from (the definitions the readers document)
DERIVATIONS = {
    ("reserved_bytes", "torch"): lambda f: f["allocated_bytes"] + f["reserved_unallocated_bytes"],
    ("reserved_unallocated_bytes", "torch"): lambda f: f["reserved_bytes"] - f["allocated_bytes"],
}


def _sources() -> list[dict[str, str]]:
    return json.loads((DIR / "sources.json").read_text(encoding="utf-8"))


def test_every_fixture_has_a_source_and_an_expectation() -> None:
    listed = {s["file"] for s in _sources()}
    on_disk = {p.name for p in DIR.iterdir() if p.name != "sources.json"}
    assert listed == on_disk
    assert all(s["url"].startswith("https://") and s["what"] for s in _sources())
    assert set(EXPECTED) <= listed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_published_report_reads_to_the_exact_bytes(name: str) -> None:
    data = (DIR / name).read_bytes()
    report = read_observed_bytes(data)
    assert report == read_observed(data.decode("utf-8"))
    expected = EXPECTED[name]
    assert len(report.records) == len(expected)
    for record, (form, gpu, stated, derived) in zip(report.records, expected, strict=True):
        assert record.source_format == form
        assert record.gpu_index == gpu
        want = {k: b(v) for k, v in stated.items()}
        for figure in derived:
            want[figure] = DERIVATIONS[(figure, "torch")](want)
        assert record.stated() == {k: want[k] for k in FIGURES if k in want}
        assert set(record.derived) == derived
        assert record.excerpt and record.excerpt in data.decode("utf-8")


def test_processes_are_listed_and_only_this_process_counts_as_process_bytes() -> None:
    """'Process 20398 has ...' is another pid as NVML saw it: listed, not this process; said in unread."""
    rec = read_observed((DIR / "torch_oom_2023_generateu10.txt").read_text()).records[0]
    assert [(p.pid, p.bytes, p.this_process) for p in rec.processes] == [(20398, b("14.52 GiB"), False)]
    assert rec.process_bytes is None
    assert any("this process" in line for line in rec.unread)
    cur = read_observed((DIR / "torch_oom_current_pytorch16417.txt").read_text()).records[0]
    assert [(p.pid, p.this_process) for p in cur.processes] == [(None, True)]


def test_allowed_and_private_pools_sentences() -> None:
    """The optional sentences malloc() prints: 'A allowed; ' (a memory fraction) and the private pools."""
    text = (
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which "
        "30.00 GiB is free. Including non-PyTorch memory, this process has 40.00 GiB memory in use. "
        "Process 77 has 9.00 GiB memory in use. 39.58 GiB allowed; Of the allocated memory 38.00 GiB is "
        "allocated by PyTorch, with 2.00 GiB allocated in private pools (e.g., CUDA Graphs), and 1.50 GiB "
        "is reserved by PyTorch but unallocated. If reserved"
    )
    rec = read_observed(text).records[0]
    assert (rec.gpu_index, rec.allowed_bytes, rec.process_bytes) == (3, b("39.58 GiB"), b("40.00 GiB"))
    assert rec.reserved_bytes == b("39.50 GiB")
    assert [(p.pid, p.this_process) for p in rec.processes] == [(None, True), (77, False)]
    assert any("private pools" in line for line in rec.unread)


def test_a_wrapped_and_truncated_message_reads_what_it_states() -> None:
    text = (
        "Skipping batch 1 due to error: CUDA out of memory. Tried to allocate 730.00 MiB.\n"
        "GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free.\n"
    )
    rec = read_observed(text).records[0]
    assert rec.stated() == {"total_bytes": b("8.00 GiB"), "free_bytes": 0, "requested_bytes": b("730.00 MiB")}
    assert any("Of the allocated memory" in line for line in rec.unread)


def test_a_figure_over_the_bound_is_named_not_raised() -> None:
    """NVML's unsigned underflow as a vLLM log printed it: '17179869184.00 GiB' (2^64 bytes) in use."""
    text = (
        "CUDA out of memory. Tried to allocate 594.00 MiB. GPU 0 has a total capacity of 11.94 GiB of which "
        "7.38 GiB is free. Including non-PyTorch memory, this process has 17179869184.00 GiB memory in use. "
        "Of the allocated memory 3.28 GiB is allocated by PyTorch, and 69.69 MiB is reserved by PyTorch but "
        "unallocated."
    )
    rec = read_observed(text).records[0]
    assert rec.process_bytes is None and rec.allocated_bytes == b("3.28 GiB")
    assert any("17179869184.00 GiB" in line and "1 EiB" in line for line in rec.unread)


def test_several_reports_come_back_in_text_order() -> None:
    a = (DIR / "torch_oom_cached_pytorch16417.txt").read_text()
    c = (DIR / "torch_oom_current_pytorch16417.txt").read_text()
    report = read_observed(f"first:\n{c}\nthen:\n{a}\nagain:\n{c}")
    assert [r.source_format for r in report.records] == ["torch_oom", "torch_oom_cached", "torch_oom"]


@pytest.mark.parametrize("text", ["", "   \n", "hello world", "CUDA out of memory.", "RuntimeError: boom"])
def test_text_that_is_not_a_report_is_one_line(text: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        read_observed(text)
    assert "\n" not in str(e.value) and "expected a GPU memory report" in str(e.value)


def test_the_bounds_are_named() -> None:
    with pytest.raises(GpumemInputError, match="at most 4,194,304"):
        read_observed("x" * (4 * 1024 * 1024 + 1))
    one = (DIR / "torch_oom_cached_pytorch16417.txt").read_text()
    with pytest.raises(GpumemInputError, match="at most 1,024"):
        read_observed(one * 1025)
    with pytest.raises(GpumemInputError, match="neither UTF-8 text nor a memory snapshot"):
        read_observed_bytes(b"\xff\xfe\x00garbage")
