"""``gpumem diagnose``: what a GPU said, explained in parts and, given the run, against the estimate.

A :class:`Diagnosis` holds the observed memory in parts (:mod:`.parts`), what the figures alone say about a
failure (:mod:`.advice`), and, where the run is given, the estimate beside the observed parts, whether the
estimate predicted what happened on a GPU of the observed capacity, and the ranked changes that would have
made it fit: the allocator's settings and the other processes first (they cost the run nothing), then the
fit report's re-estimated run changes (:func:`gpumem_gui.core.fit.fit_report`, ``fit_training``) on that GPU
with the other processes' memory taken off it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpumem_gui.core.fit import FitReport, GpuTarget, fit_report
from gpumem_gui.core.fit.sweep import estimate_any
from gpumem_gui.core.fit.targets import with_target_arch
from gpumem_gui.core.fit.training import fit_training
from gpumem_gui.core.observed.advice import Causes, DiagnosisChange, allocator_changes, causes
from gpumem_gui.core.observed.calibration import gpu_identity
from gpumem_gui.core.observed.model import ObservedMemory
from gpumem_gui.core.observed.parts import DRIVER_TOTAL_FORMATS, ObservedPart, observed_parts, size
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.results.estimate import Estimate, Explanation
from gpumem_gui.core.results.nontorch import OUTSIDE_ALLOCATOR
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.core.spec.base import Frozen
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun

NonNeg = Annotated[int, Field(ge=0)]


class Compared(Frozen):
    """One of the estimate's figures beside the observed one it corresponds to."""

    key: str
    label: str
    estimated_bytes: NonNeg
    observed_bytes: NonNeg | None
    difference_bytes: int | None = Field(description="observed - estimated (positive: we estimated less)")
    explain: Explanation


class Prediction(Frozen):
    """Whether the estimate predicted what happened on a GPU of the observed capacity."""

    capacity_bytes: NonNeg
    capacity_source: str
    other_processes_bytes: NonNeg
    margin_bytes: NonNeg
    available_bytes: int = Field(description="capacity - other processes - margin")
    needed_bytes: NonNeg = Field(description="what the estimate needs on the most-loaded GPU")
    predicted_fits: bool
    observed_failed: bool
    agrees: bool = Field(description="the estimate said it would not fit and it failed, or fits and it ran")
    observed_needed_bytes: NonNeg | None = Field(
        description="this process: in use (+ the failed request); for a failure a lower bound of its need"
    )
    missed_bytes: int | None = Field(description="observed_needed - needed (positive: we estimated less)")
    missed_share: float | None = Field(description="missed / needed")
    summary: str


class Diagnosis(Frozen):
    observed: ObservedMemory
    parts: tuple[ObservedPart, ...]
    causes: Causes
    estimate: Estimate | None = None
    compared: tuple[Compared, ...] = ()
    phases: dict[str, NonNeg] = Field(default_factory=dict, description="the estimate's phase peaks")
    phase_reached: str | None = Field(
        None, description="the estimate's earliest phase whose peak holds the observed tensors"
    )
    prediction: Prediction | None = None
    no_prediction: str = Field("", description="why there is no prediction (no capacity known, no run)")
    changes: tuple[DiagnosisChange, ...] = ()


def observed_capacity(o: ObservedMemory, target: GpuTarget | None) -> tuple[GpuTarget | None, str]:
    """The GPU the run is judged on: the report's total where it states one (CUDA's total for PyTorch and
    the engines, the driver's for nvidia-smi), else ``target`` (``--gpu``); None and why when neither."""
    if o.total_bytes is None:
        if target is None:
            return None, "the report states no total and no --gpu was given"
        return target, f"--gpu {target.name}"
    name = o.gpu_name or (target.name if target is not None else "the observed GPU")
    count = target.count if target is not None else 1
    kind = "nvidia-smi's total" if o.source_format in DRIVER_TOTAL_FORMATS else "CUDA's total"
    t = GpuTarget(name=name, capacity_bytes=max(1, o.total_bytes), count=count)
    return t, f"the report's total: {kind}, {o.source_format}"


def _tensors_wanted(o: ObservedMemory) -> int | None:
    """The most tensors the process held or asked for: allocated + the failed request, or the peak PyTorch
    reports (max_memory_allocated) where that is more."""
    now = None if o.allocated_bytes is None else o.allocated_bytes + (o.requested_bytes or 0)
    seen = [v for v in (now, o.peak_allocated_bytes) if v is not None]
    return max(seen) if seen else None


def _process_wanted(o: ObservedMemory) -> int | None:
    if o.process_bytes is None:
        return None
    return o.process_bytes + (o.requested_bytes or 0)


def compare(o: ObservedMemory, est: Estimate) -> tuple[Compared, ...]:
    """The estimate's peak of tensors, its memory beyond them and its total beside the observed."""
    tensor_keys = {c.key for c in est.phases[est.peak_phase].components}
    over = {c.key: c.bytes for c in est.components if c.key not in tensor_keys}
    tensors, process = _tensors_wanted(o), _process_wanted(o)
    # at one moment: the process's memory beyond its live tensors
    non_tensor = None
    if o.process_bytes is not None and o.allocated_bytes is not None:
        non_tensor = max(0, o.process_bytes - o.allocated_bytes)
    rows = [
        (
            "tensors",
            "tensors at the peak (max_memory_allocated)",
            est.peak_bytes,
            tensors,
            "estimate: peak of live tensors; observed: allocated + the failed request, or the peak "
            "allocated where the report states a larger one",
            {"peak_phase": est.peak_phase},
        ),
        (
            "non_tensor",
            "beyond tensors (allocator cache, CUDA context, libraries)",
            est.total_bytes - est.peak_bytes,
            non_tensor,
            "estimate: total - peak (its overhead components); observed: this process - allocated",
            over,
        ),
        (
            "process",
            "this process on the GPU (nvidia-smi)",
            est.total_bytes,
            process,
            "estimate: total; observed: this process (+ the failed request)",
            {},
        ),
        *_part_rows(o, est),
        *_engine_rows(o, est),
    ]
    return tuple(
        Compared(
            key=key,
            label=label,
            estimated_bytes=ours,
            observed_bytes=seen,
            difference_bytes=None if seen is None else seen - ours,
            explain=Explanation(
                formula=formula, inputs=inputs, source="the estimate's components; the report"
            ),
        )
        for key, label, ours, seen, formula, inputs in rows
    )


# the parts an engine's log states (observed/model.py PARTS, each reader citing its line) -> the estimate's
# component that holds the same memory (gpumem.estimate/1 ``components`` keys: vLLM weights, activations,
# kv_cache, non_torch, cudagraph; SGLang the same with one KV pool for K and V; llama.cpp compute_buffer)
ENGINE_PARTS = {
    "weights": "weights",
    "kv_cache": "kv_cache",
    "kv_cache_k": "kv_cache",
    "kv_cache_v": "kv_cache",
    "activation_peak": "activations",
    "non_torch": "non_torch",
    "cuda_graphs": "cudagraph",
    "compute_buffer": "compute_buffer",
}


# the observed parts the estimate also carries as components: memory outside PyTorch's allocator (the CUDA
# context and NCCL's buffers, results/nontorch.py OUTSIDE_ALLOCATOR; vLLM's and SGLang's non_torch) and the
# allocator's cache (results/overheads.py allocator_reserve). The cuBLAS workspace is not mapped: PyTorch
# takes it from its caching allocator (aten/src/ATen/cuda/CublasHandlePool.cpp), so a report counts it among
# the tensors.
PART_COMPONENTS = {
    "outside_pytorch": (*OUTSIDE_ALLOCATOR, "non_torch"),
    "allocator_cache": ("allocator_reserve",),
}


def _part_rows(o: ObservedMemory, est: Estimate) -> list[tuple]:
    """One row per observed part the estimate carries components for."""
    rows = []
    for part in observed_parts(o):
        comps = [c for key in PART_COMPONENTS.get(part.key, ()) if (c := est.component(key)) is not None]
        if comps and part.bytes is not None:
            formula = f"estimate: {' + '.join(c.key for c in comps)}; observed: {part.explain.formula}"
            ours = sum(c.bytes for c in comps)
            rows.append((part.key, part.label, ours, part.bytes, formula, {c.key: c.bytes for c in comps}))
    return rows


def _engine_rows(o: ObservedMemory, est: Estimate) -> list[tuple]:
    """One row per estimate component the engine's log also states (the log's parts summed into it)."""
    seen: dict[str, int] = {}
    for name, n in o.parts.items():
        key = ENGINE_PARTS.get(name)
        if key is not None:
            seen[key] = seen.get(key, 0) + n
    rows = []
    for key, n in seen.items():
        c = est.component(key)
        if c is not None:
            names = [name for name in o.parts if ENGINE_PARTS.get(name) == key]
            formula = f"estimate: its {key} component; observed: the engine's line(s) {' + '.join(names)}"
            rows.append((f"engine_{key}", f"{c.label} (the engine's line)", c.bytes, n, formula, {}))
    return rows


def phase_reached(o: ObservedMemory, est: Estimate) -> str | None:
    """The estimate's earliest phase whose peak holds the tensors the process held (and asked for)."""
    wanted = _tensors_wanted(o)
    if wanted is None:
        return None
    return next((name for name, ph in est.phases.items() if ph.peak_bytes >= wanted), None)


def _summary(p: Prediction) -> str:
    room = f"needs {size(p.needed_bytes)} of {size(p.available_bytes)} available"
    if p.observed_failed and not p.predicted_fits:
        return f"the estimate predicted the failure: it {room}"
    if p.observed_failed:
        head = f"the estimate did not predict the failure: it {room}"
        if p.missed_bytes is not None and p.missed_bytes > 0:
            return f"{head}; the process wanted at least {size(p.missed_bytes)} more than the estimate"
        return f"{head}; the process failed below the estimate's total (see the causes above)"
    holds = size(p.observed_needed_bytes or 0)
    if p.predicted_fits:
        if p.observed_needed_bytes is None:
            return f"the estimate agrees: it fits; it {room}"
        return f"the estimate agrees: it fits; it {room}, the process holds {holds}"
    if p.observed_needed_bytes is None:
        return f"the estimate said it would not fit, but the run did: it {room}"
    return f"the estimate said it would not fit, but the run holds {holds}: it {room}"


def _prediction(o: ObservedMemory, c: Causes, rep: FitReport, source: str, margin: int) -> Prediction:
    others = c.other_processes_bytes or 0
    needed = max(v.needed_bytes for v in rep.verdicts)
    capacity = rep.target.cuda_capacity
    seen = _process_wanted(o)
    missed = None if seen is None else seen - needed
    p = Prediction(
        capacity_bytes=capacity,
        capacity_source=source,
        other_processes_bytes=others,
        margin_bytes=margin,
        available_bytes=capacity - others - margin,
        needed_bytes=needed,
        predicted_fits=rep.fits,
        observed_failed=c.failed,
        agrees=rep.fits != c.failed,
        observed_needed_bytes=seen,
        missed_bytes=missed,
        missed_share=None if missed is None or not needed else missed / needed,
        summary="",
    )
    return p.model_copy(update={"summary": _summary(p)})


def _fit(
    spec: ModelSpec,
    run: InferenceRun | TrainingRun,
    target: GpuTarget,
    margin: int,
    file_weights: WeightsInventory | None,
) -> FitReport:
    """The fit report on ``target`` with ``margin`` (the other processes' memory included) per GPU."""
    t = target.model_copy(update={"count": max(target.count, run.tp * run.pp)})
    if isinstance(run, TrainingRun):
        return fit_training(spec, run, t, margin=margin)
    return fit_report(spec, run, t, margin=margin, file_weights=file_weights)


def rank_changes(
    advice: list[DiagnosisChange], run_changes: list[DiagnosisChange], pred: Prediction | None
) -> tuple[DiagnosisChange, ...]:
    """The allocator's settings and the other processes first (they cost the run nothing), unless the
    estimate says the run does not fit the GPU at all: then the run changes that fit come first (a setting
    would only move the failure later), the settings next, the run changes that do not fit last."""
    if pred is None or pred.predicted_fits:
        return (*advice, *run_changes)
    fitting = [c for c in run_changes if c.fits]
    return (*fitting, *advice, *(c for c in run_changes if not c.fits))


def diagnose(
    observed: ObservedMemory,
    *,
    spec: ModelSpec | None = None,
    run: InferenceRun | TrainingRun | None = None,
    file_weights: WeightsInventory | None = None,
    target: GpuTarget | None = None,
    margin: int = 0,
) -> Diagnosis:
    """The diagnosis of ``observed``; with ``spec`` and ``run``, against their estimate on the observed GPU
    (its total, else ``target``), ``margin`` bytes kept free per GPU (0: judge what happened as it was)."""
    c = causes(observed)
    base = Diagnosis(observed=observed, parts=observed_parts(observed), causes=c)
    advice = allocator_changes(c)
    if spec is None or run is None:
        return base.model_copy(update={"changes": tuple(advice), "no_prediction": "no run given"})
    gpu, source = observed_capacity(observed, target)
    # sized for the GPU the report names (NVML spellings too: gpu_identity), else --gpu's
    run = with_target_arch(with_target_arch(run, gpu_identity(gpu.name) if gpu else None), target)
    if gpu is None:
        est = estimate_any(spec, run, None, file_weights)
        rep, pred, run_changes = None, None, []
    else:
        rep = _fit(spec, run, gpu, margin + (c.other_processes_bytes or 0), file_weights)
        est, pred = rep.estimate, _prediction(observed, c, rep, source, margin)
        run_changes = [
            DiagnosisChange(
                kind=ch.kind,
                description=ch.description,
                source="gpumem fit: the run re-estimated with the change",
                update=ch.update,
                total_bytes=ch.total_bytes,
                fits=ch.fits,
            )
            for ch in rep.changes
        ]
    return base.model_copy(
        update={
            "estimate": est,
            "compared": compare(observed, est),
            "phases": {n: ph.peak_bytes for n, ph in est.phases.items()},
            "phase_reached": phase_reached(observed, est),
            "prediction": pred,
            "no_prediction": "" if pred is not None else source,
            "changes": rank_changes(advice, run_changes, pred),
        }
    )
