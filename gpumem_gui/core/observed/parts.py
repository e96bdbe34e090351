"""What one report's figures say, in parts: tensors, the allocator's cache, memory outside PyTorch in this
process, other processes, free; and the verdicts the figures alone support (fragmentation, other processes).

The parts follow PyTorch's own accounting (``c10/cuda/CUDACachingAllocator.cpp``,
``DeviceCachingAllocator::malloc``, the out-of-memory message it builds): ``allocated`` is live tensors,
``reserved`` is what the caching allocator holds from cudaMalloc (allocated + cached free blocks), the process
holds ``reserved`` plus what it allocates outside the allocator (CUDA context, NCCL buffers, libraries that
call cudaMalloc themselves), and the GPU's ``total - free`` is every process. Each part is a difference of
stated figures; a figure the text does not state leaves its parts unknown (``None``), never guessed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpumem_gui.core.observed.model import ObservedMemory
from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.spec.base import Frozen
from gpumem_gui.core.units import GiB, KiB, MiB, fmt_bytes

# the sources whose total is the driver's (nvidia-smi / NVML: the whole framebuffer), not CUDA's
# (cudaMemGetInfo, a few hundred MiB less): PyTorch's OOM message and the engines read cudaMemGetInfo
# (CUDACachingAllocator.cpp malloc; vLLM/SGLang torch.cuda.mem_get_info; llama.cpp
# ggml_backend_cuda_get_device_memory), nvidia-smi prints NVML's nvmlDeviceGetMemoryInfo total
DRIVER_TOTAL_FORMATS = ("nvidia_smi_table", "nvidia_smi_csv")

ALLOCATOR_SOURCE = (
    "PyTorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc, its OOM message)"
)


class ObservedPart(Frozen):
    """One part of the observed memory, with how it follows from the stated figures."""

    key: str = Field(min_length=1)
    label: str
    bytes: Annotated[int, Field(ge=0)] | None = Field(description="None: a figure it needs is not stated")
    explain: Explanation
    note: str = ""


def size(n: int) -> str:
    """A size in GiB, as every display (units.SizeUnit); three decimals below 1 GiB, where a report's
    figures are often tens of MiB (a 22 MiB request is 0.021 GiB, not 0.02)."""
    return fmt_bytes(n, digits=2 if abs(n) >= GiB else 3)


def printed_slack(o: ObservedMemory, *figures: int) -> int:
    """How far a difference of ``figures`` can be off from the rounding of the printed figures alone: half a
    unit of the last printed digit of each. PyTorch's ``format_size`` (CUDACachingAllocator.cpp) prints two
    decimals of GiB above 1 GiB, of MiB above 1 MiB, of KiB above 1 KiB; nvidia-smi prints whole MiB
    (rounded or cut: 1 MiB each)."""
    if o.source_format in DRIVER_TOTAL_FORMATS:
        return len(figures) * MiB
    unit = [GiB if f > GiB else MiB if f > MiB else KiB if f > KiB else 0 for f in figures]
    return sum(u // 200 for u in unit)


def _difference(o: ObservedMemory, a: int, b: int) -> tuple[int, str]:
    """``a - b`` as a part: 0 and a note where rounding of the printed figures explains a negative value,
    else 0 and a note that the figures disagree."""
    d = a - b
    if d >= 0:
        return d, ""
    if -d <= printed_slack(o, a, b):
        return 0, f"{-d:,} bytes below zero: within the rounding of the printed figures"
    return 0, f"the figures disagree by {-d:,} bytes (taken as 0): they may come from different moments"


def reserved(o: ObservedMemory) -> int | None:
    """PyTorch's reserved memory: stated, or allocated + reserved-but-unallocated."""
    if o.reserved_bytes is not None:
        return o.reserved_bytes
    if o.allocated_bytes is not None and o.reserved_unallocated_bytes is not None:
        return o.allocated_bytes + o.reserved_unallocated_bytes
    return None


def used(o: ObservedMemory) -> int | None:
    """Memory in use on the whole GPU: nvidia-smi's used column, or total - free."""
    if o.used_bytes is not None:
        return o.used_bytes
    if o.total_bytes is not None and o.free_bytes is not None:
        return o.total_bytes - o.free_bytes
    return None


def cache_bytes(o: ObservedMemory) -> int | None:
    """Reserved by PyTorch but unallocated: stated, or reserved - allocated."""
    if o.reserved_unallocated_bytes is not None:
        return o.reserved_unallocated_bytes
    r = reserved(o)
    if r is not None and o.allocated_bytes is not None:
        return _difference(o, r, o.allocated_bytes)[0]
    return None


def other_processes(o: ObservedMemory) -> tuple[int | None, str]:
    """(bytes, note) other processes hold on the GPU: used - this process; a value within the rounding of
    the figures it comes from is noted as possibly 0."""
    u = used(o)
    if u is None or o.process_bytes is None:
        return None, ""
    d, note = _difference(o, u, o.process_bytes)
    if 0 < d <= others_slack(o):
        note = f"within the rounding of the printed figures ({others_slack(o):,} bytes): may be 0"
    return d, note


def others_slack(o: ObservedMemory) -> int:
    """The rounding of the figures the other processes' memory is a difference of."""
    stated = (o.used_bytes,) if o.used_bytes is not None else (o.total_bytes, o.free_bytes)
    return printed_slack(o, *(v for v in (*stated, o.process_bytes) if v is not None))


def _part(
    key: str,
    label: str,
    value: int | None,
    formula: str,
    inputs: dict[str, int | None],
    source: str,
    note: str = "",
) -> ObservedPart:
    missing = [k for k, v in inputs.items() if v is None]
    if missing:
        note = f"not stated: {', '.join(missing)}"
        value = None
    return ObservedPart(
        key=key,
        label=label,
        bytes=value,
        explain=Explanation(formula=formula, inputs=inputs, source=source),
        note=note,
    )


def _cache_part(o: ObservedMemory, r: int | None) -> ObservedPart:
    what = "cached free blocks the allocator keeps from cudaMalloc, and the unused rest of split blocks"
    if o.reserved_unallocated_bytes is not None:
        formula, inputs = (
            f"reserved but unallocated (stated): {what}",
            {"reserved_unallocated_bytes": o.reserved_unallocated_bytes},
        )
    else:
        formula, inputs = (
            f"reserved - allocated: {what}",
            {"reserved_bytes": r, "allocated_bytes": o.allocated_bytes},
        )
    label = "allocator cache (reserved, unallocated)"
    return _part("allocator_cache", label, cache_bytes(o), formula, inputs, ALLOCATOR_SOURCE)


def _process_parts(o: ObservedMemory, r: int | None) -> list[ObservedPart]:
    """This process's parts: tensors, cache and outside PyTorch; or the whole process where the report does
    not split it."""
    if o.allocated_bytes is None and r is None and o.reserved_unallocated_bytes is None:
        if o.process_bytes is None:  # not PyTorch's report (nvidia-smi's table): no split to show
            return []
        return [
            _part(
                "this_process",
                "this process (not split by the report)",
                o.process_bytes,
                "process: every byte this process holds on the GPU; the report does not say how much of it "
                "is tensors, allocator cache or non-PyTorch memory",
                {"process_bytes": o.process_bytes},
                "the report's per-process figure",
            )
        ]
    split = [
        _part(
            "tensors",
            "tensors (allocated by PyTorch)",
            o.allocated_bytes,
            "allocated: live tensors (torch.cuda.memory_allocated)",
            {"allocated_bytes": o.allocated_bytes},
            ALLOCATOR_SOURCE,
        ),
        _cache_part(o, r),
    ]
    if o.process_bytes is None and used(o) is not None:  # _beyond_parts gives the rest as one part
        return split
    outside, note = (None, "") if o.process_bytes is None or r is None else _difference(o, o.process_bytes, r)
    return [
        *split,
        _part(
            "outside_pytorch",
            "outside PyTorch, this process",
            outside,
            "process - reserved: CUDA context and loaded kernels, NCCL buffers, libraries that call "
            "cudaMalloc themselves (what PyTorch calls non-PyTorch memory)",
            {"process_bytes": o.process_bytes, "reserved_bytes": r},
            ALLOCATOR_SOURCE + ": 'Including non-PyTorch memory, this process has ...'",
            note,
        ),
    ]


def _beyond_parts(o: ObservedMemory, r: int | None) -> list[ObservedPart]:
    """The rest of the GPU's used memory: other processes; where the report does not state this process's
    memory, what is beyond PyTorch's reserve (this process's non-PyTorch memory and every other process)."""
    u = used(o)
    if o.process_bytes is None and u is not None:
        if r is None:
            formula, inputs = "used = total - free (or nvidia-smi's used)", {"used_bytes": u}
            return [_part("every_process", "in use, every process", u, formula, inputs, _EVERY)]
        value, note = _difference(o, u, r)
        return [
            _part(
                "outside_pytorch_or_others",
                "outside PyTorch or other processes (not told apart)",
                value,
                "used - reserved: this process's non-PyTorch memory and every other process together (the "
                "report does not state this process's memory)",
                {"used_bytes": u, "reserved_bytes": r},
                _EVERY,
                note,
            )
        ]
    others, note = other_processes(o)
    return [
        _part(
            "other_processes",
            "other processes",
            others,
            "used - process, used = total - free (or nvidia-smi's used)",
            {"used_bytes": u, "process_bytes": o.process_bytes},
            _EVERY + "; the report names this process's",
            note,
        )
    ]


_EVERY = "cudaMemGetInfo / NVML count every process on the GPU"


def observed_parts(o: ObservedMemory) -> tuple[ObservedPart, ...]:
    """The observed memory in parts, which add up to the total where the report states every figure:
    tensors, the allocator's cache, outside PyTorch in this process, other processes, free (fewer, wider
    parts where the report does not split them); a part needing only figures the report does not state is
    left out, one needing some of them is there as unknown (None, its note naming what is missing)."""
    r = reserved(o)
    free = _part("free", "free", o.free_bytes, "free (stated)", {"free_bytes": o.free_bytes}, "the report")
    # a part none of whose figures the report states says nothing about this report: left out
    every = (*_process_parts(o, r), *_beyond_parts(o, r), free)
    return tuple(p for p in every if any(v is not None for v in p.explain.inputs.values()))
