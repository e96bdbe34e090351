"""The stable JSON document of a diagnosis, ``gpumem diagnose --json`` (schema ``gpumem.diagnosis/1``).

Built here, as :mod:`gpumem_gui.core.fit.documents` builds the estimate and fit documents, so the window's
export and the CLI print the same keys. ``observed`` holds the report's figures in bytes: the six keys every
diagnosis has (each null when the text does not state it) first, then the other figures the report states.
An incompatible change bumps the schema number.
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.diagnosis.explain import Diagnosis
from gpumem_gui.core.observed.model import FIGURES

DIAGNOSIS_SCHEMA = "gpumem.diagnosis/1"

# the figures every document names, null when not stated (issue 32: the observed figures under `observed`)
OBSERVED_KEYS = (
    "total_bytes",
    "free_bytes",
    "process_bytes",
    "allocated_bytes",
    "reserved_unallocated_bytes",
    "requested_bytes",
)


def _observed(d: Diagnosis) -> dict[str, Any]:
    o = d.observed
    figures = {k: getattr(o, k) for k in OBSERVED_KEYS}
    figures.update({k: v for k in FIGURES if k not in figures and (v := getattr(o, k)) is not None})
    return {
        **figures,
        "gpu_index": o.gpu_index,
        "gpu_name": o.gpu_name,
        "source_format": o.source_format,
        "processes": [p.model_dump(mode="json") for p in o.processes],
        "engine_parts": dict(o.parts),
        "derived": dict(o.derived),
        "unread": list(o.unread),
    }


def _estimate(d: Diagnosis) -> dict[str, Any] | None:
    est = d.estimate
    if est is None:
        return None
    return {
        "mode": est.mode,
        "engine": est.engine,
        "peak_bytes": est.peak_bytes,
        "total_bytes": est.total_bytes,
        "peak_phase": est.peak_phase,
        "components": [{"key": c.key, "label": c.label, "bytes": c.bytes} for c in est.components],
        "phases": dict(d.phases),
        "phase_reached": d.phase_reached,
        "compared": [c.model_dump(mode="json") for c in d.compared],
    }


def diagnosis_document(d: Diagnosis, model: str | None = None, run: Any = None) -> dict[str, Any]:
    """The ``gpumem diagnose --json`` document; ``model`` and ``run`` (the run model) where a run is given."""
    return {
        "schema": DIAGNOSIS_SCHEMA,
        "observed": _observed(d),
        "parts": [p.model_dump(mode="json") for p in d.parts],
        "causes": d.causes.model_dump(mode="json"),
        "model": model,
        "run": run.model_dump(mode="json") if run is not None else None,
        "estimate": _estimate(d),
        "predicted_failure": d.prediction.model_dump(mode="json") if d.prediction is not None else None,
        "no_prediction": d.no_prediction or None,
        "changes": [c.model_dump(mode="json") for c in d.changes],
    }
