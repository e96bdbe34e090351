"""The stable JSON documents of an estimate and a fit, shared by the CLI and the window's export.

``gpumem estimate --json`` (schema ``gpumem.estimate/1``) and ``gpumem fit --json`` (``gpumem.fit/1``) are
built here, so a plan exported from the window and one printed by the CLI for the same inputs are identical.
Keys are documented in README.md; an incompatible change bumps the schema number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from gpumem_gui.core.fit import FitReport
from gpumem_gui.core.fit.cluster import ClusterFit, cluster_summary
from gpumem_gui.core.results.estimate import Component, Estimate, Phase, RankClass
from gpumem_gui.core.results.reported import Reported, reported
from gpumem_gui.core.spec.params import ParamCounts

ESTIMATE_SCHEMA = "gpumem.estimate/1"
FIT_SCHEMA = "gpumem.fit/1"


def _components(cs: Iterable[Component]) -> list[dict[str, Any]]:
    return [{"key": c.key, "label": c.label, "bytes": c.bytes} for c in cs]


def _phase(ph: Phase) -> dict[str, Any]:
    """A phase's live peak, components and note, and its reserved peak where the allocator model ran."""
    out: dict[str, Any] = {
        "peak_bytes": ph.peak_bytes,
        "components": _components(ph.components),
        "note": ph.note,
    }
    if ph.reserved_bytes is not None:
        out["reserved_bytes"] = ph.reserved_bytes  # torch.cuda.max_memory_reserved over the phase
    return out


def estimate_document(
    model: str,
    params: ParamCounts | None,
    run: BaseModel,
    est: Estimate,
    fit: FitReport | None = None,
    approximate: str | None = None,
) -> dict[str, Any]:
    """The ``gpumem estimate --json`` document; with ``fit``, its ``fit`` key holds :func:`fit_document`.
    ``approximate``: the spec's reason its numbers are approximate (``ModelSpec.approximate``), else None."""
    doc: dict[str, Any] = {
        "schema": ESTIMATE_SCHEMA,
        "model": model,
        "approximate": approximate,
        "run": run.model_dump(mode="json"),
        "mode": est.mode,
        "engine": est.engine,
        "peak_bytes": est.peak_bytes,
        "total_bytes": est.total_bytes,
        "peak_phase": est.peak_phase,
        "components": _components(est.components),
        "phases": {n: _phase(ph) for n, ph in est.phases.items()},
        "per_gpu": [
            {
                "index": g.index,
                "role": g.role,
                "peak_bytes": g.peak_bytes,
                "total_bytes": g.total_bytes,
                "components": _components(g.components),
            }
            for g in est.per_gpu
        ],
        "params": {"total": params.total, "active_per_token": params.active_per_token} if params else None,
        "kv_cache_bytes": est.kv_cache_bytes,
        # what a GPU with room would report (core/results/reported.py): allocated, reserved, nvidia-smi
        "reported": rep.model_dump(mode="json") if (rep := reported_for(est)) else None,
        "facts": dict(est.facts),
        "warnings": list(est.warnings),
        "explain": {c.key: c.explain.model_dump(mode="json") for c in est.components},
    }
    if est.mode == "train":
        # training documents also name the ranks and the host memory offload needs (issue 4's keys)
        doc["per_rank"] = doc["per_gpu"]
        doc["cpu_bytes"] = est.facts.get("cpu_bytes", 0)
        doc["ranks"] = [_rank(r) for r in est.ranks]
    if fit is not None:
        doc["fit"] = fit_document(fit, approximate)
    return doc


def reported_for(est: Estimate) -> Reported | None:
    """What a GPU with room would report for ``est`` (:func:`~gpumem_gui.core.results.reported.reported`)
    where the estimate models the caching allocator's reserve (transformers inference and training), else
    None: vLLM's and SGLang's estimates are their own logs' budget figures, and llama.cpp's and Ollama's
    buffers are ggml's, not PyTorch's (ggml-cuda.cu ggml_backend_cuda_buffer_type_alloc_buffer)."""
    if not any(c.key == "allocator_reserve" for c in est.components):
        return None
    return reported(est)


def _rank(r: RankClass) -> dict[str, Any]:
    """One rank class of a training estimate (``ranks`` in ``gpumem estimate --json``)."""
    d = r.model_dump(mode="json", exclude={"components"})
    return {**d, "components": _components(r.components)}


def fit_document(rep: FitReport, approximate: str | None = None) -> dict[str, Any]:
    """The ``gpumem fit --json`` document (``approximate``: as in :func:`estimate_document`)."""
    return {
        "schema": FIT_SCHEMA,
        "approximate": approximate,
        "gpu": rep.target.name,
        "gpu_count": rep.target.count,
        "capacity_bytes": rep.target.capacity_bytes,
        "cuda_capacity_bytes": rep.target.cuda_capacity,
        "margin_bytes": rep.margin_bytes,
        "fits": rep.fits,
        "verdicts": [v.model_dump(mode="json") for v in rep.verdicts],
        "max_batch": rep.max_batch,
        "batch_limit": rep.batch_limit,
        "max_context": rep.max_context,
        "context_window": rep.context_window,
        "max_concurrency": rep.max_concurrency,
        "fewest_gpus": rep.fewest_gpus,
        "smallest_weights": rep.smallest_weights,
        "smallest_kv_dtype": rep.smallest_kv_dtype,
        "local_gpus": list(rep.local_gpus) if rep.local_gpus is not None else None,
        "local_tp": rep.local_tp,
        "changes": [c.model_dump(mode="json") for c in rep.changes],
    }


_PLACED_KEYS = ("rank", "host", "index", "key", "needed_bytes", "free_bytes", "headroom_bytes")


def cluster_document(cf: ClusterFit) -> dict[str, Any]:
    """The ``cluster`` part of ``gpumem fit --json`` (``--prometheus``): ranked placements of the plan."""
    return {
        "fits": cf.fits,
        "summary": cluster_summary(cf),
        "ranks": cf.ranks,
        "tp": cf.tp,
        "tp_across_hosts": cf.tp_across_hosts,
        "margin_bytes": cf.margin_bytes,
        "placement_count": cf.placement_count,
        "placements": [
            {
                "hosts": list(p.hosts),
                "headroom_bytes": p.headroom_bytes,
                "gpus": [{k: getattr(g, k) for k in _PLACED_KEYS} for g in p.gpus],
            }
            for p in cf.placements
        ],
        "hosts": [
            {"host": h.host, "gpus": h.gpus, "gpus_for_one_rank": h.gpus_for_one_rank} for h in cf.hosts
        ],
        "reason": cf.reason,
        # only where one applied: a cluster fit without calibrations reads as it did before they existed
        **({"calibrations": list(cf.calibrations)} if cf.calibrations else {}),
    }
