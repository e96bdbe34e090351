"""A trace's answer, and the analytic estimate of the same run beside it, per phase and per category.

The trace is what PyTorch counted (the worker's result); :func:`compare` adds the analytic numbers for the
same GPU (:func:`gpumem_gui.core.tracked_breakdown`) and the differences, so a disagreement says where it
lives. :func:`trace_document` is the ``gpumem.estimate/1`` document with ``"source": "trace"``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpumem_gui.core import (
    CATEGORIES,
    ESTIMATE_SCHEMA,
    Estimate,
    GpumemInputError,
    InferenceRun,
    LoadedModel,
    TrainingRun,
    estimate_any,
    has_compressed_cache,
    traced_categories,
    tracked_breakdown,
)
from gpumem_gui.trace.runner import TraceFailure


class TraceResult(BaseModel):
    """What the worker measured: tracker snapshots at each phase's peak (bytes by tracker category)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["inference", "train"]
    versions: dict[str, str]
    seconds: float = Field(ge=0)
    phases: dict[str, dict[str, int]] = Field(min_length=1)
    kv_cache_bytes: int | None = Field(None, ge=0)
    logits_bytes: int | None = Field(None, ge=0)
    attn_implementation_used: str | None = None
    trainable_params: int | None = Field(None, ge=0)
    vision_params: int | None = Field(None, ge=0)  # a multimodal model's tower + projector, added
    world_size: int | None = Field(None, ge=1)
    quantization: str | None = None
    notes: tuple[str, ...] = ()
    cached: bool = False

    @classmethod
    def from_worker(cls, doc: dict[str, Any], cached: bool = False) -> TraceResult:
        """Parse the worker's JSON (keys this version does not know are left out)."""
        keep = {k: v for k, v in doc.items() if k in cls.model_fields and k != "cached"}
        try:
            return cls(**keep, cached=cached)
        except ValidationError as e:
            raise TraceFailure(
                f"the trace worker answered something unexpected: {e.errors()[0]['msg']}"
            ) from None

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda k: self.phases[k].get("Total", 0))

    @property
    def peak_bytes(self) -> int:
        return int(self.phases[self.peak_phase].get("Total", 0))

    @property
    def how(self) -> str:
        """Where the answer came from: ``from the cache`` or ``in 4.2 s``."""
        return "from the cache" if self.cached else f"in {self.seconds:.1f} s"

    @property
    def environment(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.versions.items())


class PhaseComparison(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: str
    traced_bytes: int
    estimated_bytes: int | None
    traced: dict[str, int]
    estimated: dict[str, int] | None

    @property
    def difference(self) -> float | None:
        if self.estimated_bytes is None or not self.traced_bytes:
            return None
        return (self.estimated_bytes - self.traced_bytes) / self.traced_bytes

    @property
    def difference_text(self) -> str:
        d = self.difference
        return "" if d is None else f"{d * 100:+.2f} %"


class TraceReport(BaseModel):
    """The trace, the analytic estimate (None when the core cannot describe the model) and both per phase."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    result: TraceResult
    estimate: Estimate | None
    phases: tuple[PhaseComparison, ...]
    weights_note: str | None = None
    approximate: str | None = None  # the spec's ModelSpec.approximate: a generic decoder stood in

    @property
    def peak(self) -> PhaseComparison:
        return next(p for p in self.phases if p.phase == self.result.peak_phase)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the result says about itself: the worker's notes, the quantized weights' accounting, and
        that the analytic side is only approximate when the readers do not model the architecture."""
        approx = [APPROXIMATE_NOTE] if self.approximate else []
        return (*self.result.notes, *([self.weights_note] if self.weights_note else []), *approx)


APPROXIMATE_NOTE = (
    "the estimate beside the trace is approximate (architecture not modelled: a generic decoder stood in): "
    "the trace is the answer"
)
NO_ESTIMATE_NOTE = "gpumem's analytic core does not describe this architecture yet: the trace is the answer"


_PHASE_ORDER = ("load", "prefill", "decode", "forward", "backward", "optimizer")


def _order(phase: str) -> int:
    return _PHASE_ORDER.index(phase) if phase in _PHASE_ORDER else len(_PHASE_ORDER)


def _analytic(model: LoadedModel, run: InferenceRun | TrainingRun) -> tuple[Estimate | None, dict]:
    if model.spec is None:
        return None, {}
    try:
        est = estimate_any(model.spec, run, None, model.weights)
    except GpumemInputError:
        if not has_compressed_cache(model.spec):
            raise
        return None, {}  # DeepSeek-V4 runs the replay refuses (QLoRA, tp, o_a_proj): measured, no estimate
    return est, tracked_breakdown(model.spec, run, est)


def _quantized_weights(model: LoadedModel, est: Estimate | None) -> int | None:
    """The bytes a quantized checkpoint's weights really take: its files' headers, else the estimate's."""
    if model.weights is not None:
        return model.weights.total_bytes
    if est is not None and "load" in est.phases:
        return sum(c.bytes for c in est.phases["load"].components if c.key == "weights")
    return None


def account_quantized(
    result: TraceResult, model: LoadedModel, est: Estimate | None
) -> tuple[TraceResult, str]:
    """``from_config`` ignores a quantization_config (and a missing kernel dequantizes), so the traced
    parameters are the dequantized fallback, never the answer: each phase's parameters are replaced by the
    quantized weights' bytes (the files' headers, else the estimate's format)."""
    if result.mode != "inference":
        return result, (
            f"the checkpoint is quantized ({result.quantization}): the traced parameters are the dequantized "
            "fallback and were not replaced (quantized weights are accounted for inference traces only)"
        )
    real = _quantized_weights(model, est)
    if real is None:
        return result, (
            f"the checkpoint is quantized ({result.quantization}): the traced parameters are the dequantized "
            "fallback and were not replaced (no file headers or format to take the quantized bytes from)"
        )
    load = result.phases.get("load") or next(iter(result.phases.values()))
    traced = int(load.get("Parameter", 0))
    delta = real - traced
    phases = {
        k: {**v, "Parameter": int(v.get("Parameter", 0)) + delta, "Total": int(v.get("Total", 0)) + delta}
        for k, v in result.phases.items()
    }
    src = "the files' headers" if model.weights is not None else "the estimate's weight format"
    return result.model_copy(update={"phases": phases}), (
        f"the checkpoint is quantized ({result.quantization}): the traced (dequantized) parameters, "
        f"{traced:,} B, were replaced by the quantized weights' {real:,} B from {src}"
    )


def compare(model: LoadedModel, run: InferenceRun | TrainingRun, result: TraceResult) -> TraceReport:
    """The trace beside the analytic estimate of the same run (for the GPU / rank the trace measured)."""
    est, analytic = _analytic(model, run)
    note = None
    if result.quantization:
        result, note = account_quantized(result, model, est)
    phases = []
    for name, snap in sorted(result.phases.items(), key=lambda kv: _order(kv[0])):
        ours = analytic.get(name)
        phases.append(
            PhaseComparison(
                phase=name,
                traced_bytes=int(snap.get("Total", 0)),
                estimated_bytes=sum(ours.values()) if ours is not None else None,
                traced=traced_categories(snap),
                estimated=ours,
            )
        )
    approx = model.spec.approximate if model.spec is not None else None
    return TraceReport(
        result=result, estimate=est, phases=tuple(phases), weights_note=note, approximate=approx
    )


def trace_document(model: LoadedModel, run: InferenceRun | TrainingRun, rep: TraceReport) -> dict[str, Any]:
    """The ``gpumem.estimate/1`` document of a trace: ``"source": "trace"``, what PyTorch counted per phase
    and by category at the peak, and the analytic estimate beside it with the differences."""
    r = rep.result
    peak = rep.peak
    return {
        "schema": ESTIMATE_SCHEMA,
        "source": "trace",
        "model": model.name,
        "approximate": rep.approximate,
        "mode": r.mode,
        "run": run.model_dump(mode="json"),
        "versions": r.versions,
        "seconds": r.seconds,
        "cached": r.cached,
        "peak_bytes": r.peak_bytes,
        "peak_phase": r.peak_phase,
        "phases": {p.phase: {"peak_bytes": p.traced_bytes, "breakdown": p.traced} for p in rep.phases},
        "breakdown_at_peak": peak.traced,
        "tracker_categories_at_peak": r.phases[r.peak_phase],
        "kv_cache_bytes": r.kv_cache_bytes,
        "logits_bytes": r.logits_bytes,
        "trainable_params": r.trainable_params,
        "vision_params": r.vision_params,
        "world_size": r.world_size,
        "attn_implementation_used": r.attn_implementation_used,
        "notes": list(rep.notes),
        "analytic": _analytic_part(rep),
        "categories": list(CATEGORIES),
    }


def _analytic_part(rep: TraceReport) -> dict[str, Any] | None:
    if rep.estimate is None:
        return None
    peak = rep.peak
    return {
        "peak_bytes": max((p.estimated_bytes or 0) for p in rep.phases),
        "phases": {p.phase: {"peak_bytes": p.estimated_bytes, "breakdown": p.estimated} for p in rep.phases},
        "breakdown_at_peak": peak.estimated,
        "difference_at_peak": {
            c: (peak.estimated or {}).get(c, 0) - peak.traced.get(c, 0) for c in CATEGORIES
        },
        "relative_difference_at_peak": peak.difference,
        "kv_cache_bytes": rep.estimate.kv_cache_bytes,
    }
