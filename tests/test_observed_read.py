"""Issue 32 item 1: each published GPU memory report in tests/reference/observed/ read to the exact bytes.

The expected figures are written as the report prints them ("23.65 GiB") and turned into bytes here with
exact fractions (GiB = 2^30, MiB = 2^20, KiB = 2^10 as PyTorch's format_size and nvidia-smi print them), so a
wrong unit or a wrong sentence -> figure mapping fails. Each fixture's source URL is in sources.json.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core import FIGURES, GpumemInputError, read_observed, read_observed_bytes

DIR = Path(__file__).parent / "reference" / "observed"
# nvidia-smi's MiB, and memory_summary's 2020 labels "KB" / "MB" (the same powers, see torch_summary.py)
POW2 = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def b(text: str) -> int:
    """'23.65 GiB' -> bytes, rounded to the nearest byte (half to even, as Decimal does)."""
    number, unit = text.split()
    return round(Fraction(number) * POW2[unit])


# file -> what each record must read to (tests/reference/observed/expected.json says how it is written)
EXPECTED: dict[str, list[dict[str, Any]]] = json.loads((DIR / "expected.json").read_text(encoding="utf-8"))[
    "files"
]


# derived figures and the stated ones they come from (the definitions the readers document)
DERIVATIONS = {
    "reserved_bytes": lambda f: f["allocated_bytes"] + f["reserved_unallocated_bytes"],
    "reserved_unallocated_bytes": lambda f: f["reserved_bytes"] - f["allocated_bytes"],
}


def _sources() -> list[dict[str, str]]:
    return json.loads((DIR / "sources.json").read_text(encoding="utf-8"))


def test_every_fixture_has_a_source_and_an_expectation() -> None:
    listed = {s["file"] for s in _sources()}
    on_disk = {p.name for p in DIR.iterdir() if p.name not in ("sources.json", "expected.json")}
    assert listed == on_disk
    assert all(s["url"].startswith("https://") and s["what"] for s in _sources())
    assert set(EXPECTED) == listed


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_published_report_reads_to_the_exact_bytes(name: str) -> None:
    data = (DIR / name).read_bytes()
    report = read_observed_bytes(data)
    assert report == read_observed(data.decode("utf-8"))
    expected = EXPECTED[name]
    assert len(report.records) == len(expected)
    for record, r in zip(report.records, expected, strict=True):
        assert (record.source_format, record.gpu_index) == (r["format"], r["gpu"])
        want = {k: b(v) for k, v in r["stated"].items()}
        for figure in r.get("derived", ()):
            want[figure] = DERIVATIONS[figure](want)
        assert record.stated() == {k: want[k] for k in FIGURES if k in want}
        assert set(record.derived) == set(r.get("derived", ()))
        assert record.gpu_name == r.get("gpu_name")
        assert [(p.pid, p.bytes) for p in record.processes] == [
            (pid, b(v)) for pid, v in r.get("processes", ())
        ]
        assert dict(record.parts) == {k: b(v) for k, v in r.get("parts", {}).items()}
        text = data.decode("utf-8")
        assert record.excerpt and all(line in text for line in record.excerpt.splitlines())


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


def _stats(pairs: dict[str, int], style: str) -> str:
    """memory_stats() as Python prints its OrderedDict, as a plain dict, or as json.dumps writes it."""
    if style == "ordered":
        return "OrderedDict([" + ", ".join(f"({k!r}, {v})" for k, v in pairs.items()) + "])"
    if style == "json":
        return json.dumps(pairs, indent=2)
    return repr(pairs)


# memory_stats() keys as torch/cuda/memory.py documents them (STAT.POOL.METRIC, sizes in bytes); no printed
# memory_stats() was found in a public issue, so these texts are written here in the forms Python prints
STATS = {
    "active.all.current": 310,
    "allocated_bytes.all.current": 15728640000,
    "allocated_bytes.all.freed": 9_000_000,
    "allocated_bytes.all.peak": 16106127360,
    "allocated_bytes.large_pool.current": 15728000000,
    "num_ooms": 0,
    "reserved_bytes.all.current": 17179869184,
    "reserved_bytes.all.peak": 17179869184,
}


@pytest.mark.parametrize("style", ["ordered", "dict", "json"])
def test_memory_stats_in_each_printed_form(style: str) -> None:
    (rec,) = read_observed("stats: " + _stats(STATS, style)).records
    assert rec.source_format == "torch_memory_stats"
    assert rec.stated() == {
        "allocated_bytes": 15728640000,
        "reserved_bytes": 17179869184,
        "reserved_unallocated_bytes": 17179869184 - 15728640000,
        "peak_allocated_bytes": 16106127360,
        "peak_reserved_bytes": 17179869184,
    }
    assert set(rec.derived) == {"reserved_unallocated_bytes"}


def test_two_devices_stats_are_two_records() -> None:
    text = "cuda:0 " + _stats(STATS, "dict") + "\ncuda:1 " + _stats(dict(STATS, **{"num_ooms": 1}), "dict")
    assert len(read_observed(text).records) == 2


def test_ollama_inference_compute_of_current_releases() -> None:
    """discover/types.go LogDetails today: name is the device (CUDA1), description the GPU's name."""
    line = (
        'time=2026-03-01T10:00:00.000Z level=INFO source=types.go:60 msg="inference compute" '
        "id=GPU-0a1b2c3d library=CUDA compute=9.0 name=CUDA1 "
        'description="NVIDIA H100 80GB HBM3" libdirs=ollama,cuda_v12 driver=12.8 pci_id=0000:2a:00.0 '
        'type=discrete total="79.2 GiB" available="78.7 GiB"'
    )
    (rec,) = read_observed(line).records
    assert (rec.source_format, rec.gpu_index, rec.gpu_name) == ("ollama", 1, "NVIDIA H100 80GB HBM3")
    assert rec.stated() == {"total_bytes": b("79.2 GiB"), "free_bytes": b("78.7 GiB")}


def test_vllm_startup_accounting_of_2025() -> None:
    """gpu_worker.py's startup line of vLLM 0.10, verbatim from the quote of a public 8xL40S log in
    validation/data/engine_logs/vllm.json: free / total, the desired budget and the actual usage by part."""
    line = (
        "Free memory on device (43.93/44.42 GiB) on startup. "
        "Desired GPU memory utilization is (0.9, 39.98 GiB). "
        "Actual usage is 27.72 GiB for weight, 1.4 GiB for peak activation, "
        "0.21 GiB for non-torch memory, and 3.45 GiB for CUDAGraph memory."
    )
    (rec,) = read_observed(line).records
    assert rec.stated() == {
        "free_bytes": b("43.93 GiB"),
        "total_bytes": b("44.42 GiB"),
        "allowed_bytes": b("39.98 GiB"),
    }
    assert dict(rec.parts) == {
        "weights": b("27.72 GiB"),
        "activation_peak": b("1.40 GiB"),
        "non_torch": b("0.21 GiB"),
        "cuda_graphs": b("3.45 GiB"),
    }
