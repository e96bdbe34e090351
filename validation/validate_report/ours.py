"""Which of our numbers stands for a published one, and the computed parts of the reason lines.

A reason in ``validation/data/published_*.json`` is a template: ``{name}`` (or ``{name:format}``) is filled
from :data:`INFERENCE_FIELDS` / :data:`TRAINING_FIELDS`, each computed only when its template is used.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpumem_gui.core.formats import gguf_plan
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.results.reported import nvidia_smi_prediction, reserved_prediction
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun, estimate_training

from .common import GiB, MiB


@dataclass(frozen=True)
class Ctx:
    """What an inference reason may look at."""

    spec: ModelSpec
    run: InferenceRun
    est: Estimate
    capacity: int | None
    measured: float
    ours: float
    unit_bytes: float = 1.0  # bytes one unit of the measured number stands for (tokens -> KV bytes)


@dataclass(frozen=True)
class TCtx:
    """What a training reason may look at."""

    spec: ModelSpec
    run: TrainingRun
    est: Estimate
    measured: float
    ours: float


# ---- our numbers ------------------------------------------------------------------------------------------


def _c(key: str) -> Callable[[Estimate], float]:
    return lambda e: e.component(key).bytes  # type: ignore[union-attr]


OURS: dict[str, tuple[str, Callable[[Estimate], float]]] = {
    "weights_context": (
        "weights + CUDA context components (a model just moved to the GPU, as nvidia-smi shows it)",
        lambda e: _c("weights")(e) + _c("cuda_context")(e),
    ),
    "peak": (
        "peak_bytes (live tensors at the peak: torch.cuda.max_memory_allocated)",
        lambda e: e.peak_bytes,
    ),
    "weights": ("weights component (on the GPU)", _c("weights")),
    "cpu_bytes": ("facts.cpu_bytes (weights left in host memory)", lambda e: e.facts["cpu_bytes"]),  # type: ignore[dict-item]
    "all_weights": (
        "weights + cpu_bytes (the whole model)",
        lambda e: _c("weights")(e) + e.facts["cpu_bytes"],
    ),  # type: ignore[operator]
    "kv_cache": ("kv_cache component", _c("kv_cache")),
    "compute_buffer": ("compute_buffer component", _c("compute_buffer")),
    "activations": ("activations component", _c("activations")),
    "non_torch": ("non_torch component", _c("non_torch")),
    "kv_pool_bytes": ("facts.kv_pool_bytes", lambda e: e.facts["kv_pool_bytes"]),  # type: ignore[dict-item]
    "kv_tokens": ("facts.kv_tokens", lambda e: e.facts["kv_tokens"]),  # type: ignore[dict-item]
    "gpu_blocks": ("facts.kv_tokens / 16", lambda e: e.facts["kv_tokens"] / 16),  # type: ignore[operator]
    "max_concurrency": ("facts.max_concurrency", lambda e: e.facts["max_concurrency"]),  # type: ignore[dict-item]
}

# the published training figures we can stand for (their wording is in published_training.json's "ours")
TRAIN_OURS_KEYS = ("peak", "fwd_bwd", "reserved", "total", "max_seq", "fits")


def ours_train(est: Estimate, key: str) -> float:
    """Our number for a published training figure of kind ``peak``, ``fwd_bwd``, ``reserved`` or ``total``."""
    if key == "peak":
        return est.peak_bytes
    if key == "fwd_bwd":
        return max(est.phases["forward"].peak_bytes, est.phases["backward"].peak_bytes)
    if key == "reserved":  # core/results/reported.py: the allocator model's reserved peak + workspaces
        return reserved_prediction(est)
    if key == "total":  # nvidia-smi: reserved + the context and NCCL's buffers
        return nvidia_smi_prediction(est)
    raise KeyError(key)


# ---- the computed parts of inference reasons --------------------------------------------------------------


def _compute_buffer(c: Ctx) -> str:
    """Our compute buffer (the largest graph stage, runtimes/llamacpp_compute.py) against the log."""
    comp = c.est.component("compute_buffer")
    stage = comp.explain.inputs.get("stage", "?") if comp is not None else "?"
    text = (
        f"our compute buffer is the largest graph stage of one micro-batch ({stage}, {c.ours / MiB:.1f} MiB; "
        "ggml's graph allocator reuses memory between stages)"
    )
    gap = (c.measured - c.ours) / MiB
    return text + (
        f"; the log is {gap:.0f} MiB larger, so a graph stage is missing"
        if gap > 0
        else f"; the log is {-gap:.0f} MiB smaller"
    )


def _quant_mix(c: Ctx) -> str:
    """Which layer tensors our quantization mix bumps above the base type (the usual GGUF size gap)."""
    plan = [t for t in gguf_plan(c.spec, c.run.weights) if t.layer is not None]
    by_type: dict[str, int] = {}
    for t in plan:
        by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.nbytes
    base = max(by_type, key=lambda k: by_type[k])
    bumped: dict[str, int] = {}
    for t in plan:
        if t.ggml_type != base and t.ggml_type.startswith(("Q6", "Q8")):
            role = t.name.split(".")[2]
            bumped[role] = bumped.get(role, 0) + t.nbytes
    top = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in sorted(bumped.items(), key=lambda kv: -kv[1])[:3])
    return (
        f"ours is {(c.ours - c.measured) / MiB:+.0f} MiB; our mix (current llama-quantize rules) keeps these "
        f"layer tensors above {base}: {top}. A file made by another llama.cpp version can differ in these "
        "choices; its header (gpumem inspect x.gguf) gives the exact bytes"
    )


def _vllm_activations(c: Ctx) -> str:
    """vLLM's profiled peak as we model it (runtimes/vllm_profile.py activation): the larger of the dummy
    forward and the sampler's dummy run, each with its size."""
    x = c.est.component("activations").explain.inputs  # type: ignore[union-attr]
    reqs = min(int(x["max_num_seqs"]), int(x["T"]))
    return (
        f"ours = max(dummy forward of {x['T']} tokens x (2h + max(3F, qkv + q) / tp) x dt = "
        f"{int(x['forward_bytes']) / GiB:.2f} GiB, sampler run {reqs} x vocab {x['vocab']} x (dt + 37 B) = "
        f"{int(x['sampler_bytes']) / GiB:.2f} GiB) (a formula, not the profiled forward)"
    )


def _vllm_pool(c: Ctx) -> str:
    """Implied non-KV memory of the log against ours, from the budget."""
    e = c.est
    budget = int(e.facts["budget_bytes"])  # type: ignore[arg-type]
    implied_non_kv = budget - c.measured * c.unit_bytes
    ours_non_kv = budget - int(e.facts["kv_pool_bytes"])  # type: ignore[arg-type]
    parts = ", ".join(
        f"{k} {e.component(k).bytes / GiB:.2f}"  # type: ignore[union-attr]
        for k in ("weights", "activations", "non_torch", "cudagraph")
    )
    return (
        f"budget {budget / GiB:.2f} GiB (gpu_memory_utilization {c.run.gpu_memory_utilization} x "
        f"{(c.capacity or 0) / GiB:.2f} GiB); the log implies {implied_non_kv / GiB:.2f} GiB outside the KV "
        f"pool, ours is {ours_non_kv / GiB:.2f} GiB ({parts} GiB)"
    )


INFERENCE_FIELDS: dict[str, Callable[[Ctx], object]] = {
    "compute_buffer": _compute_buffer,
    "quant_mix": _quant_mix,
    "vllm_activations": _vllm_activations,
    "vllm_pool": _vllm_pool,
}


# ---- the computed parts of training reasons ---------------------------------------------------------------


def components_gib(est: Estimate, *keys: str) -> str:
    """Our components at the peak, in GiB, for a reason line."""
    out = []
    for k in keys:
        c = est.component(k)
        if c is not None and c.bytes:
            out.append(f"{k} {c.bytes / GiB:.2f}")
    return ", ".join(out) + " GiB"


class _Components:
    """``{g:gradients,optimizer_states}`` in a template: those components of ours, in GiB."""

    def __init__(self, est: Estimate) -> None:
        self.est = est

    def __format__(self, spec: str) -> str:
        return components_gib(self.est, *spec.split(","))


def _no_ckpt_reserved(c: TCtx) -> float:
    est = estimate_training(c.spec, c.run.model_copy(update={"grad_ckpt": False}))
    return ours_train(est, "reserved")


def _no_dropout_fwd_bwd(c: TCtx) -> float:
    est = estimate_training(c.spec, c.run.model_copy(update={"dropout": 0.0}))
    return ours_train(est, "fwd_bwd")


TRAINING_FIELDS: dict[str, Callable[[TCtx], object]] = {
    "ours_gib": lambda c: c.ours / GiB,
    "peak_phase": lambda c: c.est.peak_phase,
    "peak_gib": lambda c: c.est.peak_bytes / GiB,
    "cached_gib": lambda c: (reserved_prediction(c.est) - c.est.peak_bytes) / GiB,
    "g": lambda c: _Components(c.est),
    "no_ckpt_reserved_gib": lambda c: _no_ckpt_reserved(c) / GiB,
    "nodrop_mib": lambda c: _no_dropout_fwd_bwd(c) / MiB,
}


# ---- templates --------------------------------------------------------------------------------------------


class _Lazy(dict):
    """A template's fields, each computed on first use."""

    def __init__(self, fields: Mapping[str, Callable[[object], object]], ctx: object) -> None:
        super().__init__()
        self.fields, self.ctx = fields, ctx

    def __missing__(self, key: str) -> object:
        value = self[key] = self.fields[key](self.ctx)
        return value


def explain(template: str, fields: Mapping[str, Callable], ctx: object) -> str:
    """A reason template filled from ``fields`` for ``ctx``."""
    return template.format_map(_Lazy(fields, ctx))


def template_problem(template: str, fields: Mapping[str, Callable]) -> str | None:
    """Why ``template`` cannot be filled from ``fields`` (a bad brace, an unknown field), or None."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        return f"bad template ({e}); a literal brace is written {{{{ or }}}}"
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if name not in fields:
            return f"unknown field {{{name}}} (known: {', '.join(sorted(fields))})"
        if name == "g" and not spec:
            return "{g:...} needs the components, e.g. {g:gradients,optimizer_states}"
    return None
