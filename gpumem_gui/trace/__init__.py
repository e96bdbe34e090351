"""Trace mode: the exact answer from the real model code, counted by PyTorch itself.

The real transformers model is built from the model's ``config.json`` under ``FakeTensorMode`` (nothing is
allocated) and run as the request says (inference prefill / decode, or one training step, per rank for
data-parallel jobs); PyTorch's ``MemTracker`` counts every live tensor. The worker
(:mod:`gpumem_gui.trace.gpumem_trace_worker`) runs in the user's own ML environment: in this process when
torch and transformers import here, else in a subprocess of the Python they name. The product itself never
needs torch. Results are cached on disk by (config, run, versions) and shown beside the analytic estimate.

    from gpumem_gui.trace import trace
    report = trace(load_model("Llama-3.2-1B"), make_run(seq=4096), python="/path/to/venv/bin/python")
    report.result.peak_bytes, report.peak.difference
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpumem_gui.core import InferenceRun, LoadedModel, TrainingRun
from gpumem_gui.trace import cache
from gpumem_gui.trace.request import TraceRequest, make_request
from gpumem_gui.trace.result import NO_ESTIMATE_NOTE, TraceReport, TraceResult, compare, trace_document
from gpumem_gui.trace.runner import (
    DEFAULT_TIMEOUT_S,
    TraceFailure,
    TraceJob,
    environment_versions,
    in_process_available,
    run_trace,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "NO_ESTIMATE_NOTE",
    "TraceFailure",
    "TraceJob",
    "TraceReport",
    "TraceRequest",
    "TraceResult",
    "cached_result",
    "compare",
    "environment_versions",
    "in_process_available",
    "make_request",
    "trace",
    "trace_document",
]


def cached_result(request: TraceRequest, python: str | None) -> tuple[TraceResult | None, str]:
    """(the cached result, or None; the cache key) for ``request`` in ``python``'s environment."""
    key = cache.cache_key(request, environment_versions(python))
    doc = cache.load(key)
    return (TraceResult.from_worker(doc, cached=True) if doc is not None else None), key


def trace(
    model: LoadedModel,
    run: InferenceRun | TrainingRun,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    trust_remote_code: bool = False,
    use_cache: bool = True,
    on_job: Callable[[TraceJob], None] | None = None,
) -> TraceReport:
    """Trace ``run`` on ``model`` (see the module docstring) and compare it with the analytic estimate.
    ``on_job`` receives the subprocess job as soon as it starts (the window keeps it to cancel)."""
    request = make_request(model, run, trust_remote_code)
    result, key = cached_result(request, python) if use_cache else (None, "")
    if result is None:
        t0 = time.perf_counter()
        if python is not None and on_job is not None:
            job = TraceJob(request, python, timeout)
            on_job(job)
            doc = job.result()
        else:
            doc = run_trace(request, python, timeout)
        doc["seconds"] = round(time.perf_counter() - t0, 3)  # the whole trace, the process start included
        if use_cache:
            cache.store(key, doc)
        result = TraceResult.from_worker(doc)
    return compare(model, run, result)
