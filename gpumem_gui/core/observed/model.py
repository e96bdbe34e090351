"""The figures one report states about one GPU, in bytes, and what it did not state.

Every figure is ``None`` when the text does not state it (never guessed from the others: a figure derived by
arithmetic is named in ``derived``). Sizes are int bytes, as everywhere in the core; the text's own unit
(PyTorch's ``GiB`` = 2^30, nvidia-smi's ``MiB`` = 2^20) is applied by the reader that read it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpumem_gui.core.spec.model import Frozen

Bytes = Annotated[int, Field(ge=0, le=1 << 60)]  # up to 1 EiB: no GPU or cluster report is larger

# where a report came from, as its source prints it (each reader documents the source it follows)
SourceFormat = Literal[
    "torch_oom",  # torch.OutOfMemoryError, 2024+: "... Including non-PyTorch memory, this process has ..."
    "torch_oom_2023",  # the 2023 form: "GPU 0 has a total capacty of ..." (sic)
    "torch_oom_legacy",  # "(GPU 0; X total capacity; Y already allocated; Z free; W reserved in total ...)"
    "torch_oom_cached",  # the oldest: "... W cached)"
    "nvidia_smi_table",  # the default nvidia-smi table
    "nvidia_smi_csv",  # nvidia-smi --query-gpu=... --format=csv
    "torch_memory_summary",  # torch.cuda.memory_summary()
    "torch_memory_stats",  # torch.cuda.memory_stats() (a dict, printed or JSON)
    "torch_memory_snapshot",  # torch.cuda.memory._snapshot() pickle, read by a restricted unpickler
    "vllm",  # vLLM startup / profiling / OOM lines
    "sglang",  # SGLang startup / OOM lines
    "llamacpp",  # llama.cpp (and Ollama's runner) buffer / allocation-failure lines
    "ollama",  # Ollama's server lines: "inference compute" (total / available), the offload line's free list
]
SOURCE_FORMATS: tuple[str, ...] = SourceFormat.__args__  # type: ignore[attr-defined]

# the figures a report can state, in the order the diagnosis reads them (gpumem.diagnosis/1 ``observed``)
FIGURES: tuple[str, ...] = (
    "total_bytes",  # the GPU's capacity as the source states it (CUDA's total or nvidia-smi's, see source)
    "free_bytes",  # free on the GPU at that moment
    "process_bytes",  # in use by this process, non-PyTorch memory included
    "allocated_bytes",  # live tensors (torch.cuda.memory_allocated at the failure / report)
    "reserved_bytes",  # reserved by PyTorch's caching allocator (allocated + cached free blocks)
    "reserved_unallocated_bytes",  # reserved by PyTorch but unallocated (the allocator's cache)
    "requested_bytes",  # the allocation that failed ("Tried to allocate ...")
    "peak_allocated_bytes",  # max_memory_allocated, where the report states it
    "peak_reserved_bytes",  # max_memory_reserved, where the report states it
    "used_bytes",  # used on the whole GPU (nvidia-smi's "Memory-Usage" used column), every process
    "allowed_bytes",  # the cap set_per_process_memory_fraction set ("X allowed;" in the OOM message)
)

# the parts of its memory an engine's log states (vLLM's profiling lines, SGLang's startup lines, llama.cpp's
# buffer lines); each reader says which line gives which part
PartName = Literal[
    "weights",  # the model's weights on this GPU (vLLM "model weights take", llama.cpp "model buffer size")
    "kv_cache",  # the KV cache (vLLM "reserved for KV Cache" / "Available KV cache memory", llama.cpp)
    "kv_cache_k",  # SGLang's "K size" (its K and V pools are stated apart)
    "kv_cache_v",  # SGLang's "V size"
    "activation_peak",  # vLLM "PyTorch activation peak memory"
    "non_torch",  # vLLM "non_torch_memory": CUDA context, NCCL, other libraries (not PyTorch's allocator)
    "cuda_graphs",  # vLLM "CUDAGraph memory" / "Graph capturing ... took", SGLang "Capture cuda graph end"
    "compute_buffer",  # llama.cpp "CUDA0 compute buffer size"
]
PARTS: tuple[str, ...] = PartName.__args__  # type: ignore[attr-defined]


class ObservedProcess(Frozen):
    """One process a report lists on the GPU, with the memory the driver (NVML) says it uses."""

    pid: Annotated[int, Field(ge=0, le=(1 << 32) - 1)] | None = None  # NVML's pid is an unsigned int
    name: Annotated[str, Field(max_length=200)] | None = None
    bytes: Bytes
    # True where the report says it is the reporting process ("Including non-PyTorch memory, this process")
    this_process: bool = False


class ObservedMemory(Frozen):
    """The memory one report states about one GPU (or one process on it)."""

    source_format: SourceFormat
    gpu_index: Annotated[int, Field(ge=0, le=1023)] | None = None
    gpu_name: Annotated[str, Field(max_length=200)] | None = None
    total_bytes: Bytes | None = None
    free_bytes: Bytes | None = None
    process_bytes: Bytes | None = None
    allocated_bytes: Bytes | None = None
    reserved_bytes: Bytes | None = None
    reserved_unallocated_bytes: Bytes | None = None
    requested_bytes: Bytes | None = None
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    used_bytes: Bytes | None = None
    allowed_bytes: Bytes | None = None
    # the parts of this GPU's memory an engine's log states, by name (:data:`PARTS`)
    parts: dict[PartName, Bytes] = Field(default_factory=dict)
    # the processes the report lists on this GPU (PyTorch's OOM message, nvidia-smi's processes table)
    processes: Annotated[tuple[ObservedProcess, ...], Field(max_length=1024)] = ()
    # figures computed from stated ones by a definition (e.g. reserved = allocated + reserved-unallocated),
    # each with the formula, so the diagnosis can say which numbers the text itself gave
    derived: dict[str, str] = Field(default_factory=dict)
    # one line per figure or part of the text that could not be read, naming it
    unread: tuple[str, ...] = ()
    # the lines of the text this record was read from (for display and for a calibration's provenance)
    excerpt: Annotated[str, Field(max_length=4000)] = ""

    @model_validator(mode="after")
    def _derived_are_figures(self) -> ObservedMemory:
        bad = [k for k in self.derived if k not in FIGURES or getattr(self, k) is None]
        if bad:
            raise ValueError(f"derived names figures that are not set: {', '.join(sorted(bad))}")
        return self

    def stated(self) -> dict[str, int]:
        """The figures the record has (stated or derived), by name, in :data:`FIGURES` order."""
        return {k: v for k in FIGURES if (v := getattr(self, k)) is not None}


class ObservedReport(Frozen):
    """Everything read from one pasted text: a record per GPU or per report found, and what was not read."""

    records: tuple[ObservedMemory, ...] = Field(min_length=1, max_length=1024)
    unread: tuple[str, ...] = ()


def latest_record(records: tuple[ObservedMemory, ...]) -> int:
    """Which of one GPU's records to explain: the last failed allocation, else the last record (the latest
    state a log shows). The CLI's ``diagnose`` and the window's picker both start from it."""
    failed = [i for i, r in enumerate(records) if r.requested_bytes is not None]
    return (failed or list(range(len(records))))[-1]
