"""Issue 32 item 1: each published GPU memory report in tests/reference/observed/ read to the exact bytes.

The expected figures are written as the report prints them ("23.65 GiB") and turned into bytes here with
exact fractions (GiB = 2^30, MiB = 2^20, KiB = 2^10 as PyTorch's format_size and nvidia-smi print them), so a
wrong unit or a wrong sentence -> figure mapping fails. Each fixture's source URL is in sources.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest

from gpumem_gui.core import FIGURES, GpumemInputError, read_observed, read_observed_bytes

DIR = Path(__file__).parent / "reference" / "observed"
POW2 = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}  # nvidia-smi's MiB too


def b(text: str) -> int:
    """'23.65 GiB' -> bytes, rounded to the nearest byte (half to even, as Decimal does)."""
    number, unit = text.split()
    return round(Fraction(number) * POW2[unit])


@dataclass(frozen=True)
class R:
    """One expected record: its format, GPU, the figures as the text prints them, the derived ones."""

    form: str
    gpu: int | None
    stated: dict[str, str]
    derived: set[str] = field(default_factory=set)
    name: str | None = None
    procs: tuple[tuple[int | None, str], ...] = ()  # (pid, size as printed) of the processes listed


# file -> a record per report (per GPU for nvidia-smi), in text order
EXPECTED: dict[str, list[R]] = {
    "torch_oom_current_pytorch16417.txt": [
        R(
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
            procs=((None, "23.60 GiB"),),
        )
    ],
    "torch_oom_current_vsmtrans3.txt": [
        R(
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
            procs=((None, "15.48 GiB"),),
        )
    ],
    "torch_oom_2023_generateu10.txt": [
        R(
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
            procs=((20398, "14.52 GiB"),),
        )
    ],
    "torch_oom_2023_mygirlgpt11.txt": [
        R(
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
            procs=((None, "3.44 GiB"),),
        )
    ],
    "torch_oom_2023_ootdiffusion167.txt": [
        R(
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
        R(
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
        R(
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
        R(
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
        R(
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
    "nvidia_smi_table_rlinf255.txt": [
        R(
            "nvidia_smi_table",
            0,
            {"used_bytes": "507 MiB", "total_bytes": "24564 MiB"},
            name="NVIDIA GeForce RTX 4090",
        ),
        R(
            "nvidia_smi_table",
            1,
            {"used_bytes": "459 MiB", "total_bytes": "24564 MiB"},
            name="NVIDIA GeForce RTX 4090",
        ),
    ],
    "nvidia_smi_table_triangulation80.txt": [
        R(
            "nvidia_smi_table",
            0,
            {"used_bytes": "8559 MiB", "total_bytes": "10989 MiB"},
            name="GeForce RTX 208...",
        ),
        R(
            "nvidia_smi_table",
            1,
            {"used_bytes": "7384 MiB", "total_bytes": "10989 MiB"},
            name="GeForce RTX 208...",
        ),
        R(
            "nvidia_smi_table",
            2,
            {"used_bytes": "7384 MiB", "total_bytes": "10989 MiB"},
            name="GeForce RTX 208...",
        ),
        R("nvidia_smi_table", 3, {}, name="GeForce RTX 208..."),  # cut before its Memory-Usage line
    ],
    "nvidia_smi_table_localgpt14.txt": [
        R(
            "nvidia_smi_table",
            0,
            {"used_bytes": "1585 MiB", "total_bytes": "11264 MiB"},
            name="NVIDIA GeForce GTX 1080 Ti",
        ),
    ],
    "nvidia_smi_table_gpustat130.txt": [
        R(
            "nvidia_smi_table",
            0,
            {"used_bytes": "0 MiB", "total_bytes": "16384 MiB"},
            name="Tesla P100-PCIE...",
        ),
    ],
    "nvidia_smi_processes_nvitop152.txt": [
        R("nvidia_smi_table", 0, {}, procs=((10734, "160 MiB"), (58661, "3 MiB"))),
        R("nvidia_smi_table", 1, {}, procs=((10734, "160 MiB"),)),
        R("nvidia_smi_table", 2, {}, procs=((18243, "64 MiB"), (22720, "34 MiB"))),
    ],
    "nvidia_smi_csv_clic89.txt": [
        R("nvidia_smi_csv", None, {"free_bytes": "2131 MiB"}, name="NVIDIA GeForce GTX 1050 Ti"),
        R("nvidia_smi_csv", None, {"free_bytes": "16000 MiB"}, name="NVIDIA GeForce RTX 3080 Ti"),
    ],
}

# derived figures and the stated ones they come from (the definitions the readers document)
DERIVATIONS = {
    "reserved_bytes": lambda f: f["allocated_bytes"] + f["reserved_unallocated_bytes"],
    "reserved_unallocated_bytes": lambda f: f["reserved_bytes"] - f["allocated_bytes"],
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
    for record, r in zip(report.records, expected, strict=True):
        assert (record.source_format, record.gpu_index) == (r.form, r.gpu)
        want = {k: b(v) for k, v in r.stated.items()}
        for figure in r.derived:
            want[figure] = DERIVATIONS[figure](want)
        assert record.stated() == {k: want[k] for k in FIGURES if k in want}
        assert set(record.derived) == r.derived
        assert record.gpu_name == r.name
        assert [(p.pid, p.bytes) for p in record.processes] == [(pid, b(v)) for pid, v in r.procs]
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


@pytest.mark.parametrize(
    ("text", "free"),
    [
        # the header names each field with its unit; each value carries it too (csv)
        (
            "index, name, memory.total [MiB], memory.free [MiB]\n"
            "3, NVIDIA H100 80GB HBM3, 81559 MiB, 80000 MiB\n",
            80000,
        ),
        # nounits: the header's unit applies (csv,nounits)
        (
            "index, name, memory.total [MiB], memory.free [MiB]\n3, NVIDIA H100 80GB HBM3, 81559, 80000\n",
            80000,
        ),
        # noheader with the command: the command names the columns, the values carry the unit
        (
            "$ nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader\n"
            "3, NVIDIA H100 80GB HBM3, 81559 MiB, 80000 MiB\n",
            80000,
        ),
    ],
)
def test_nvidia_smi_csv_forms(text: str, free: int) -> None:
    """The csv forms of nvidia-smi --query-gpu, written here in its layout (header "field [unit]")."""
    (rec,) = read_observed(text).records
    assert (rec.source_format, rec.gpu_index, rec.gpu_name) == ("nvidia_smi_csv", 3, "NVIDIA H100 80GB HBM3")
    assert rec.stated() == {"total_bytes": 81559 << 20, "free_bytes": free << 20}


def test_nvidia_smi_csv_without_header_or_command_is_not_read() -> None:
    with pytest.raises(GpumemInputError, match="no memory report found"):
        read_observed("NVIDIA GeForce GTX 1050 Ti, 2131\nNVIDIA GeForce RTX 3080 Ti, 16000\n")


def test_an_oom_and_a_table_in_one_paste() -> None:
    oom = (DIR / "torch_oom_current_pytorch16417.txt").read_text()
    table = (DIR / "nvidia_smi_table_rlinf255.txt").read_text()
    report = read_observed(f"{table}\n```\nthen the job died:\n{oom}")
    assert [(r.source_format, r.gpu_index) for r in report.records] == [
        ("nvidia_smi_table", 0),
        ("nvidia_smi_table", 1),
        ("torch_oom", 0),
    ]
