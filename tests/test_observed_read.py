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
# nvidia-smi's MiB, and memory_summary's 2020 labels "KB" / "MB" (the same powers, see torch_summary.py)
POW2 = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


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
    parts: dict[str, str] = field(default_factory=dict)  # an engine's parts, as printed


PR14447 = {
    "weights": "21.21 GiB",
    "non_torch": "0.20 GiB",
    "activation_peak": "0.37 GiB",
    "kv_cache": "1.57 GiB",
}

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
    "torch_summary_pytorch35901.txt": [
        R(
            "torch_memory_summary",
            0,
            {
                "allocated_bytes": "1062 MiB",
                "peak_allocated_bytes": "4877 MiB",
                "reserved_bytes": "12420 MiB",
                "peak_reserved_bytes": "12420 MiB",
            },
            {"reserved_unallocated_bytes"},
        )
    ],
    "torch_summary_pytorch38884.txt": [
        R(
            "torch_memory_summary",
            0,
            {
                "allocated_bytes": "1024 bytes",
                "peak_allocated_bytes": "133632 bytes",
                "reserved_bytes": "2048 KiB",
                "peak_reserved_bytes": "2048 KiB",
            },
            {"reserved_unallocated_bytes"},
        )
    ],
    "torch_summary_vissl514.txt": [
        R("torch_memory_summary", None, {"reserved_bytes": "8184 MiB", "peak_reserved_bytes": "9330 MiB"}),
    ],
    "torch_oom_current_hip_pytorch175431.txt": [
        R(
            "torch_oom",
            7,
            {
                "requested_bytes": "2.00 MiB",
                "total_bytes": "287.98 GiB",
                "free_bytes": "203.49 GiB",
                "allocated_bytes": "68.63 GiB",
                "reserved_unallocated_bytes": "14.93 GiB",
            },
            {"reserved_bytes"},
        )
    ],
    "vllm_v0_workers_pr14447.txt": [
        R("vllm", None, {}, parts=PR14447),
        R("vllm", None, {"total_bytes": "23.58 GiB", "allowed_bytes": "23.35 GiB"}, parts=PR14447),
        R("vllm", None, {"total_bytes": "23.58 GiB", "allowed_bytes": "23.35 GiB"}, parts=PR14447),
    ],
    "vllm_profiling_lines_pr10511.txt": [
        R(
            "vllm",
            None,
            {"total_bytes": "79.22 GiB", "allowed_bytes": "71.29 GiB"},
            parts={
                "weights": "14.96 GiB",
                "non_torch": "1.79 GiB",
                "activation_peak": "1.26 GiB",
                "kv_cache": "53.29 GiB",
            },
        ),
        R(
            "vllm",
            None,
            {"total_bytes": "79.22 GiB", "allowed_bytes": "71.29 GiB"},
            parts={"weights": "7.48 GiB", "non_torch": "3.58 GiB", "activation_peak": "1.26 GiB"},
        ),
    ],
    "vllm_v0_budget_pr12126.txt": [
        R(
            "vllm",
            None,
            {"total_bytes": "79.22 GiB", "allowed_bytes": "71.29 GiB"},
            parts={
                "weights": "19.86 GiB",
                "non_torch": "0.16 GiB",
                "activation_peak": "36.63 GiB",
                "kv_cache": "14.65 GiB",
            },
        ),
    ],
    # SGLang prints GiB as "GB" (sglang.py's docstring): the expected sizes say GiB
    "vllm_sglang_kv_vllm21348.txt": [
        R("vllm", None, {}, parts={"kv_cache": "8.11 GiB"}),
        R("sglang", None, {}, parts={"kv_cache_k": "8.23 GiB", "kv_cache_v": "8.23 GiB"}),
    ],
    "sglang_startup_pr18263.txt": [
        R(
            "sglang",
            None,
            {"free_bytes": "74.01 GiB"},  # the last free figure stated (Memory pool end)
            parts={"weights": "56.98 GiB", "kv_cache_k": "76.44 GiB", "kv_cache_v": "76.44 GiB"},
        ),
    ],
    "sglang_tp_ranks_club3090_1261.txt": [  # each rank allocates two pools (the target and the draft model)
        R(
            "sglang",
            None,
            {"free_bytes": "8.40 GiB"},
            parts={"kv_cache_k": "3.46 GiB", "kv_cache_v": "3.46 GiB"},
        ),
        R(
            "sglang",
            None,
            {"free_bytes": "6.23 GiB"},
            parts={"kv_cache_k": "1.08 GiB", "kv_cache_v": "1.08 GiB"},
        ),
        R(
            "sglang",
            None,
            {"free_bytes": "7.63 GiB"},
            parts={"kv_cache_k": "3.46 GiB", "kv_cache_v": "3.46 GiB"},
        ),
        R(
            "sglang",
            None,
            {"free_bytes": "5.46 GiB"},
            parts={"kv_cache_k": "1.08 GiB", "kv_cache_v": "1.08 GiB"},
        ),
    ],
    "llamacpp_oom_ik749.txt": [
        # the MiB line and the exact bytes of the same failed allocation: the bytes, stated last, are kept
        R("llamacpp", 0, {"requested_bytes": "292926534144 bytes"}, parts={"kv_cache": "379.23 MiB"}),
        *(
            R("llamacpp", i, {}, parts={"kv_cache": kv})
            for i, kv in enumerate(
                ["82.44", "65.95", "82.44", "82.44", "65.95", "82.44", "82.44", "32.98", "32.98", "16.49"], 1
            )
            for kv in [kv + " MiB"]
        ),
        R("llamacpp", None, {}, parts={"kv_cache": "1005.79 MiB"}),  # KV self size: every device together
    ],
    "llamacpp_load_oom_20431.txt": [R("llamacpp", 0, {"requested_bytes": "151851674624 bytes"})],
    "llamacpp_ollama_runner_6860.txt": [
        R("llamacpp", None, {}, parts={"kv_cache": "5120.00 MiB"}),
        R("llamacpp", 4, {"requested_bytes": "150995968 bytes"}),
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
        assert dict(record.parts) == {k: b(v) for k, v in r.parts.items()}
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
