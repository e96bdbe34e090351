"""Why an observed allocation failed, from the figures alone, and what the allocator's own settings or the
GPU's other tenants offer.

Fragmentation: before it raises out-of-memory, PyTorch's caching allocator frees every cached block that is
not split and retries cudaMalloc (``DeviceCachingAllocator::malloc``: ``release_available_cached_blocks``,
then ``release_cached_blocks``). What the OOM message still calls "reserved by PyTorch but unallocated" is
therefore the unused rest of segments that hold live tensors: when the request is no larger than it, the
bytes were there but not in one block, and the failure is fragmentation. The settings that address it are
PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` options (``docs/source/notes/cuda.rst``, "Optimizing memory usage
with PYTORCH_CUDA_ALLOC_CONF"; parsed in ``c10/cuda/CUDAAllocatorConfig.cpp``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpumem_gui.core.observed.model import ObservedMemory
from gpumem_gui.core.observed.parts import cache_bytes, other_processes, others_slack, reserved, size
from gpumem_gui.core.spec.base import Frozen

NOTES_CUDA = "PyTorch docs/source/notes/cuda.rst (Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF)"
_ALLOCATOR = "c10/cuda/CUDACachingAllocator.cpp"


class DiagnosisChange(Frozen):
    """One change that would have made the run fit: a run change re-estimated by the fit report
    (``total_bytes``, ``fits``), or a setting / an action outside the run that no estimate prices
    (``total_bytes`` and ``fits`` None; the description says why it applies)."""

    kind: str
    description: str
    source: str = ""
    update: dict[str, object] = Field(default_factory=dict)
    total_bytes: Annotated[int, Field(ge=0)] | None = None
    fits: bool | None = None


class Causes(Frozen):
    """What the figures alone say about a failure."""

    failed: bool = Field(description="the report is of a failed allocation (it states the request)")
    requested_bytes: int | None
    shortfall_bytes: int | None = Field(
        description="requested - free: what the GPU lacked for the request (<= 0: the GPU had it free)"
    )
    fragmentation: bool | None = Field(
        description="requested <= reserved-but-unallocated: the bytes were cached, not in one block; "
        "None: the report does not state both"
    )
    other_processes_bytes: int | None
    other_processes_cause: bool | None = Field(
        description="other processes hold at least the shortfall: without them the request would have fit"
    )
    lines: tuple[str, ...] = Field(description="the verdicts in words, one line each")


def causes(o: ObservedMemory) -> Causes:
    """The verdicts the figures support (see the module docstring); none is guessed from missing ones."""
    req, free, cache = o.requested_bytes, o.free_bytes, cache_bytes(o)
    others, _ = other_processes(o)
    shortfall = req - free if req is not None and free is not None else None
    frag = req <= cache if req is not None and cache is not None else None
    # other processes matter only beyond the rounding of the figures they are the difference of
    held = others if others is not None and others > others_slack(o) else None
    others_cause = None
    if held is not None and shortfall is not None and shortfall > 0:
        others_cause = held >= shortfall
    lines = []
    if req is not None:
        lines.append(
            f"the failed request: {size(req)}" + (f", with {size(free)} free" if free is not None else "")
        )
    if frag:
        lines.append(
            f"fragmentation: PyTorch held {size(cache)} reserved but unallocated, more than the "
            f"{size(req)} requested, yet no cached block was large enough (the allocator had already "
            "released every whole cached block)"
        )
    elif frag is False:
        lines.append(
            f"not fragmentation alone: the allocator's unallocated {size(cache)}, even in one block, is less "
            "than the request"
        )
    if held is not None:
        tail = ""
        if others_cause:
            tail = f": more than the {size(shortfall)} missing, the request would have fit without them"
        elif others_cause is False:
            tail = f": less than the {size(shortfall)} missing, not enough alone"
        lines.append(f"other processes hold {size(held)} on this GPU{tail}")
    lines += _capacity_lines(o, shortfall)
    return Causes(
        failed=req is not None,
        requested_bytes=req,
        shortfall_bytes=shortfall,
        fragmentation=frag,
        other_processes_bytes=held,
        other_processes_cause=others_cause,
        lines=tuple(lines),
    )


def _capacity_lines(o: ObservedMemory, shortfall: int | None) -> list[str]:
    """What the request was measured against: the GPU's total, a per-process cap, the free memory."""
    req, out = o.requested_bytes, []
    if req is None:
        return out
    if o.total_bytes is not None and req > o.total_bytes:
        out.append(f"the request alone is more than the GPU's total {size(o.total_bytes)}")
    r = reserved(o)
    if o.allowed_bytes is not None and r is not None and r + req > o.allowed_bytes:
        out.append(
            f"the per-process cap {size(o.allowed_bytes)} (torch.cuda.set_per_process_memory_fraction) "
            f"was reached: reserved {size(r)} + the request is more"
        )
    elif shortfall is not None and shortfall <= 0:
        out.append(
            "the figures show no lack of memory: the GPU reported more free than the request; cudaMalloc "
            "can still fail that close to the limit (its page granularity, the driver's own use), or memory "
            "was freed between the failure and the message"
        )
    return out


def allocator_changes(c: Causes) -> list[DiagnosisChange]:
    """The allocator's settings where fragmentation is the cause, and the other processes where they hold
    memory; the first ones are ranked before any run change (they cost the run nothing)."""
    out: list[DiagnosisChange] = []
    if c.fragmentation:
        out += [
            DiagnosisChange(
                kind="allocator",
                description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in place "
                "instead of new cudaMalloc blocks, so freed ranges join and split blocks stop stranding "
                "memory (what PyTorch's OOM message itself suggests for a large reserved-unallocated)",
                source=f"{NOTES_CUDA}: expandable_segments; {_ALLOCATOR} (ExpandableSegment, OOM message)",
            ),
            DiagnosisChange(
                kind="allocator",
                description="PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N (e.g. 512): blocks larger than N MB "
                "are never split, so large cached blocks stay whole for large requests",
                source=f"{NOTES_CUDA}: max_split_size_mb; {_ALLOCATOR} (release_available_cached_blocks)",
            ),
        ]
    if c.other_processes_bytes is not None and c.other_processes_cause:
        out.append(
            DiagnosisChange(
                kind="other_processes",
                description=f"free the {size(c.other_processes_bytes)} other processes hold on this "
                "GPU: enough for the request that failed (nvidia-smi lists them), or run on a GPU no one "
                "else uses",
                source="cudaMemGetInfo counts every process on the GPU",
            )
        )
        out.append(
            DiagnosisChange(
                kind="allocator",
                description="if another process is PyTorch, its cache counts too: "
                "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6 there (with "
                "torch.cuda.set_per_process_memory_fraction) makes it give back cached blocks it does not "
                "use",
                source=f"{NOTES_CUDA}: garbage_collection_threshold; {_ALLOCATOR} "
                "(garbage_collect_cached_blocks)",
            )
        )
    return out
