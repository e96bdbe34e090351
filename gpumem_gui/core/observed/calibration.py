"""A calibration: what one measurement on one GPU implies for later estimates on that GPU.

A user gives what the GPU said for a run (a successful run's ``nvidia-smi`` and
``torch.cuda.memory_summary()``, or an OOM message); :func:`calibration_from` keeps the two quantities those
figures imply, each only from figures the text states:

* **non-PyTorch memory** of the process: what the process uses minus what PyTorch's caching allocator has
  reserved (the CUDA context, the kernels and libraries it loads, NCCL; whatever ``torch.cuda`` does not
  count). PyTorch's OOM message states both ("Including non-PyTorch memory, this process has X memory in use.
  Of the allocated memory Y is allocated by PyTorch, and Z is reserved by PyTorch but unallocated":
  c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::malloc``), so there it is X - (Y + Z);
  ``nvidia-smi``'s used memory minus ``memory_summary``'s reserved gives the same for a process alone on
  its GPU.
* **allocator overhead**: reserved / allocated (the caching allocator's cached free blocks and its block
  rounding over the live tensors), at the peak where the text states both peaks, else at the moment it
  reports; or the peak reserved it states over the estimate's own allocated peak for the run the user
  names.

:mod:`gpumem_gui.core.observed.apply` applies a calibration to an estimate; :func:`calibration_for` picks
the one that applies to a GPU.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.observed.model import Bytes, ObservedMemory, SourceFormat
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.core.spec.base import Frozen
from gpumem_gui.core.units import GiB

# one line of text a person types: no control characters (a newline would break the one-line messages)
_LINE = r"^[^\x00-\x1f\x7f]*$"
Name = Annotated[str, Field(min_length=1, max_length=60, pattern=_LINE)]
Text = Annotated[str, Field(max_length=120, pattern=_LINE)]


class Stack(Frozen):
    """The software the measurement ran on, as the user names it (free text; every field optional)."""

    torch: Text = ""
    driver: Text = ""
    cuda: Text = ""
    framework: Text = Field("", description="e.g. 'transformers 5.24', 'vLLM 0.11'")
    note: Text = ""

    def text(self) -> str:
        parts = [f"{k} {v}" for k, v in self.model_dump().items() if v and k != "note"]
        return ", ".join(parts + ([self.note] if self.note else []))


class Measurement(Frozen):
    """What was measured and where from: the formats read, the figures used (bytes, by
    :data:`~gpumem_gui.core.observed.model.FIGURES` name), the text they were read from and the date."""

    source_formats: tuple[SourceFormat, ...] = Field(min_length=1)
    figures: dict[str, Bytes]
    excerpt: Annotated[str, Field(max_length=4000)] = ""
    measured_on: date


class Calibration(Frozen):
    """A named calibration for one GPU (and the engine and software it was measured with)."""

    name: Name
    gpu_name: Annotated[str, Field(min_length=1, max_length=200, pattern=_LINE)] = Field(
        description="the GPU as NVML / nvidia-smi or the catalog spell it"
    )
    gpu_total_bytes: Bytes | None = Field(
        None, description="the GPU's total memory, where the text states it"
    )
    engine: Annotated[str, Field(max_length=40, pattern=_LINE)] | None = Field(
        None, description="the engine of the measured run (None: any engine)"
    )
    mode: Literal["inference", "train"] | None = Field(
        None, description="inference or training (the allocator's overhead differs): None, either"
    )
    stack: Stack = Stack()
    measurement: Measurement
    non_torch_bytes: Bytes | None = Field(None, description="process memory outside PyTorch's reserved")
    non_torch_formula: Annotated[str, Field(max_length=400)] = ""
    # reserved / allocated; at least 1 by definition (the allocator reserves every block it hands out)
    allocator_ratio: Annotated[float, Field(ge=1.0, le=1e6, allow_inf_nan=False)] | None = None
    allocator_formula: Annotated[str, Field(max_length=400)] = ""

    @model_validator(mode="after")
    def _something(self) -> Calibration:
        if self.non_torch_bytes is None and self.allocator_ratio is None:
            raise ValueError("a calibration needs the non-PyTorch memory, the allocator overhead or both")
        return self

    def summary(self) -> str:
        """One line: what it measured, where from and when."""
        parts = []
        if self.non_torch_bytes is not None:
            parts.append(f"non-PyTorch memory {self.non_torch_bytes / GiB:.2f} GiB")
        if self.allocator_ratio is not None:
            figures = self.measurement.figures
            base = figures.get("peak_allocated_bytes", figures.get("allocated_bytes"))
            at = f" at {_fmt(base)} allocated" if base is not None else ""  # what the ratio was measured on
            parts.append(f"reserved / allocated {self.allocator_ratio:.4f}{at}")
        formats = ", ".join(self.measurement.source_formats)
        return f"{' and '.join(parts)} ({formats} on {self.gpu_name}, {self.measurement.measured_on})"


def _fmt(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _pick(records: tuple[ObservedMemory, ...], figure: str) -> ObservedMemory | None:
    """The first record that states ``figure``."""
    return next((r for r in records if getattr(r, figure) is not None), None)


def _reserved(r: ObservedMemory) -> tuple[int, str] | None:
    """PyTorch's reserved bytes of one record and how they were had: stated, or allocated +
    reserved-unallocated (the OOM message's two figures: reserved = allocated + cached, a definition)."""
    if r.reserved_bytes is not None:
        how = " = allocated + reserved-unallocated" if "reserved_bytes" in r.derived else ""
        return r.reserved_bytes, f"reserved {_fmt(r.reserved_bytes)}{how} ({r.source_format})"
    if r.allocated_bytes is not None and r.reserved_unallocated_bytes is not None:
        total = r.allocated_bytes + r.reserved_unallocated_bytes
        return total, (
            f"reserved = allocated {_fmt(r.allocated_bytes)} + reserved-unallocated "
            f"{_fmt(r.reserved_unallocated_bytes)} ({r.source_format})"
        )
    return None


def _process(records: tuple[ObservedMemory, ...]) -> tuple[ObservedMemory, int, str] | None:
    """The record with the process's memory, the bytes and what they are: the process's own figure (PyTorch's
    "this process has"), else the one process nvidia-smi's table lists on the GPU, else nvidia-smi's used
    memory of a GPU whose table lists no other process (used counts every process on the GPU)."""
    if (r := _pick(records, "process_bytes")) is not None and r.process_bytes is not None:
        return r, r.process_bytes, "this process has"
    for r in records:
        if len(r.processes) == 1:
            p = r.processes[0]
            return r, p.bytes, f"process {p.pid if p.pid is not None else ''} uses".replace("  ", " ")
    for r in records:
        if r.used_bytes is not None and not r.processes:
            return r, r.used_bytes, "used on the GPU (every process)"
    return None


def _non_torch(records: tuple[ObservedMemory, ...], used: dict[str, int]) -> tuple[int | None, str, str]:
    """(bytes, formula, why not): the process's memory minus PyTorch's reserved."""
    found = _process(records)
    proc, process, what = found if found is not None else (None, None, "")
    # reserved from the same record as the process figure where it states it (one moment), else any
    res = next(((r, x) for r in (*(() if proc is None else (proc,)), *records) if (x := _reserved(r))), None)
    if process is None or proc is None or res is None:
        missing = [
            n
            for n, x in (
                ("the process's memory (its OOM message, or nvidia-smi's used with one process)", process),
                ("PyTorch's reserved", res),
            )
            if x is None
        ]
        return None, "", " and ".join(missing)
    reserved, how = res[1]
    if process < reserved:
        raise GpumemInputError(
            f"the text's process memory ({_fmt(process)}) is below PyTorch's reserved ({_fmt(reserved)}): "
            "the figures are not of one process at one moment",
            field="observed",
        )
    used.update(process_bytes=process, reserved_bytes=reserved)
    formula = (
        f"non-PyTorch = {what} {_fmt(process)} ({proc.source_format}) - {how} = {_fmt(process - reserved)}"
    )
    return process - reserved, formula, ""


def _less_nccl(non_torch: int | None, formula: str, est: Estimate | None) -> tuple[int | None, str]:
    """The measured non-PyTorch memory less the NCCL buffers gpumem models for the measured run: those scale
    with the parallel layout (results/nontorch.py) and stay modelled in later estimates, the calibration
    keeping the context and libraries. Without a run named, a multi-GPU measurement keeps them in."""
    nccl = 0 if est is None else max((c.bytes for c in est.components if c.key == "nccl_buffers"), default=0)
    if non_torch is None or not nccl:
        return non_torch, formula
    left = max(0, non_torch - nccl)
    return left, f"{formula} - NCCL buffers modelled for the measured run {_fmt(nccl)} = {_fmt(left)}"


def _ratio(
    records: tuple[ObservedMemory, ...], est: Estimate | None, used: dict[str, int]
) -> tuple[float | None, str, str]:
    """(reserved / allocated, formula, why not): the peaks of one record, else one moment of one record,
    else the stated peak reserved over the estimate's allocated peak."""
    for r in records:
        if r.peak_reserved_bytes is not None and r.peak_allocated_bytes:
            used.update(
                peak_reserved_bytes=r.peak_reserved_bytes, peak_allocated_bytes=r.peak_allocated_bytes
            )
            return _checked(
                r.peak_reserved_bytes,
                r.peak_allocated_bytes,
                "peak reserved",
                "peak allocated",
                r.source_format,
            )
    for r in records:
        res = _reserved(r)
        if res is not None and r.allocated_bytes:
            used.update(reserved_bytes=res[0], allocated_bytes=r.allocated_bytes)
            return _checked(res[0], r.allocated_bytes, "reserved", "allocated", r.source_format)
    peak = _pick(records, "peak_reserved_bytes")
    if peak is not None and peak.peak_reserved_bytes is not None and est is not None and est.peak_bytes:
        if peak.peak_reserved_bytes < est.peak_bytes:  # the estimate is above what the GPU had: no overhead
            return (
                None,
                "",
                (
                    f"a peak reserved above the estimate's allocated peak (the text's "
                    f"{_fmt(peak.peak_reserved_bytes)} is below the estimate's {_fmt(est.peak_bytes)})"
                ),
            )
        used.update(peak_reserved_bytes=peak.peak_reserved_bytes)
        return _checked(
            peak.peak_reserved_bytes,
            est.peak_bytes,
            "peak reserved",
            "the estimate's allocated peak",
            peak.source_format,
        )
    return None, "", "PyTorch's allocated and reserved (or a peak reserved and a run to estimate)"


def _checked(reserved: int, allocated: int, rname: str, aname: str, fmt: str) -> tuple[float, str, str]:
    if reserved < allocated:
        raise GpumemInputError(
            f"the text's {rname} ({_fmt(reserved)}) is below {aname} ({_fmt(allocated)}); the allocator "
            "reserves every byte it hands out, so these figures are not of one moment",
            field="observed",
        )
    ratio = reserved / allocated
    return ratio, f"{rname} {_fmt(reserved)} / {aname} {_fmt(allocated)} ({fmt}) = {ratio:.4f}", ""


def _one_gpu(records: tuple[ObservedMemory, ...], gpu_index: int | None) -> tuple[ObservedMemory, ...]:
    """The records of one GPU: those of ``gpu_index`` (and those naming no GPU); without it the text must
    be about one GPU."""
    indices = sorted({r.gpu_index for r in records if r.gpu_index is not None})
    if gpu_index is None:
        if len(indices) > 1:
            raise GpumemInputError(
                f"the text is about GPUs {', '.join(map(str, indices))}: pick one with --gpu-index",
                field="gpu_index",
            )
        return records
    if indices and gpu_index not in indices:
        raise GpumemInputError(
            f"the text has no GPU {gpu_index} (it has GPU {', '.join(map(str, indices))})", field="gpu_index"
        )
    return tuple(r for r in records if r.gpu_index in (None, gpu_index))


def calibration_from(
    records: tuple[ObservedMemory, ...],
    est: Estimate | None,
    *,
    name: str,
    gpu_name: str | None = None,
    gpu_index: int | None = None,
    engine: str | None = None,
    mode: Literal["inference", "train"] | None = None,
    stack: Stack | None = None,
    measured_on: date,
) -> Calibration:
    """The calibration the figures of ``records`` imply (see the module docstring); ``est`` is the estimate
    of the run measured (None: no run named). ``gpu_name`` names the GPU where the text does not (it must be
    the same GPU where it does). Raises :class:`GpumemInputError` in one line naming what is missing."""
    recs = _one_gpu(records, gpu_index)
    stated = next((r.gpu_name for r in recs if r.gpu_name), None)
    if stated and gpu_name and gpu_identity(stated) != gpu_identity(gpu_name):
        raise GpumemInputError(f"the text is about {short(stated)}, not {short(gpu_name)}", field="gpu")
    gpu = stated or gpu_name
    if not gpu:
        raise GpumemInputError("the text does not name its GPU: give it with --gpu NAME", field="gpu")
    used: dict[str, int] = {}
    non_torch, nt_formula, nt_missing = _non_torch(recs, used)
    non_torch, nt_formula = _less_nccl(non_torch, nt_formula, est)
    ratio, r_formula, r_missing = _ratio(recs, est, used)
    if non_torch is None and ratio is None:
        raise GpumemInputError(
            f"cannot calibrate: the text does not state {nt_missing} (for the non-PyTorch memory), nor "
            f"{r_missing} (for the allocator overhead)",
            field="observed",
        )
    return Calibration(
        name=name.strip(),
        gpu_name=gpu,
        gpu_total_bytes=next((r.total_bytes for r in recs if r.total_bytes is not None), None),
        engine=engine,
        mode=mode,
        stack=stack or Stack(),
        measurement=Measurement(
            source_formats=tuple(dict.fromkeys(r.source_format for r in recs)),
            figures=used,
            excerpt="\n".join(r.excerpt for r in recs if r.excerpt)[:4000],
            measured_on=measured_on,
        ),
        non_torch_bytes=non_torch,
        non_torch_formula=nt_formula,
        allocator_ratio=ratio,
        allocator_formula=r_formula,
    )


def gpu_identity(name: str) -> str:
    """What two spellings of one GPU share: its catalog id where the name (or the name without NVML's
    'NVIDIA ' / 'NVIDIA GeForce ' prefix or an 'AMD ' one) is a catalog id or alias, else the name with case,
    spaces, '-' and '_' ignored ('NVIDIA H100 80GB HBM3', 'H100' and 'h100-sxm-80gb' are one GPU)."""
    text = name.strip()
    for candidate in (text, re.sub(r"^(NVIDIA\s+(GeForce\s+)?|AMD\s+)", "", text, flags=re.I)):
        try:
            return find_gpu(candidate).id
        except GpumemInputError:
            continue
    return re.sub(r"[\s_\-]+", "-", text.lower())


def run_kind(run: object) -> tuple[str, Literal["inference", "train"]]:
    """(engine, mode) of a run as its estimate names them: an inference run's engine; a training run's
    estimate is the transformers one (core/training/estimate.py)."""
    if isinstance(run, InferenceRun):
        return run.engine, "inference"
    return "transformers", "train"


def calibration_for(calibrations: tuple[Calibration, ...], gpu_name: str, run: object) -> Calibration | None:
    """The calibration that applies to ``run`` on the GPU ``gpu_name``: of those for that GPU (any spelling,
    :func:`gpu_identity`), that engine and that mode (or any, where they name none), the newest measurement
    (ties: the last saved); None when there is none."""
    key = gpu_identity(gpu_name)
    engine, mode = run_kind(run)
    fits = [
        (c.measurement.measured_on, i, c)
        for i, c in enumerate(calibrations)
        if gpu_identity(c.gpu_name) == key and c.engine in (None, engine) and c.mode in (None, mode)
    ]
    return max(fits, key=lambda t: (t[0], t[1]))[2] if fits else None
