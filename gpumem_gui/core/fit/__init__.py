"""Will it fit, and what would make it fit.

A verdict compares each GPU's ``total_bytes`` (what nvidia-smi would show as used) with the memory a process
can allocate, CUDA's total (or the free memory now), minus a safety margin. The solvers use the estimate's
monotone structure (memory never falls as batch, context or bits grow) and bisect, so each answer costs a few
dozen estimates, not a scan. Every search stays inside the
run fields' declared ranges, and a candidate the run model rejects (a value out of range, tp not dividing
the heads) simply does not fit: a solver answers "none", it never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, ValidationError

from gpumem_gui.core.cancel import checkpoint
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.fields import run_fields
from gpumem_gui.core.fit.gpu_target import GpuTarget
from gpumem_gui.core.formats import KV_DTYPES, engine_kv_dtypes, get_weight_format
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import InferenceRun, estimate_inference, runtime
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.units import MiB, SizeUnit, fmt_bytes

# Default safety margin per GPU: llama.cpp's --fit leaves 1024 MiB free on every device
# (ggml-org/llama.cpp PR #16653, "cannot fulfill margin of 1024 MiB").
DEFAULT_MARGIN_BYTES = 1024 * MiB


class Verdict(Frozen):
    gpu_index: int
    role: str
    needed_bytes: int
    available_bytes: int
    margin_bytes: int
    fits: bool
    headroom_bytes: int = Field(description="available - margin - needed; negative: misses by that much")

    def words(self, unit: SizeUnit = SizeUnit.GIB) -> str:
        """``fits with 3.20 GiB headroom`` / ``misses by 1.50 GiB``; a miss with bytes to spare is an engine
        that does not start or run the batch at once (its KV pool holds less than the requested context)."""
        if self.fits:
            return f"fits with {fmt_bytes(self.headroom_bytes, unit)} headroom"
        if self.headroom_bytes >= 0:
            return "misses: the engine's KV pool is too small for the requested context"
        return f"misses by {fmt_bytes(-self.headroom_bytes, unit)}"


class Change(Frozen):
    """One change to the run, with the memory it would need and whether that fits."""

    kind: str
    description: str
    update: dict[str, object]
    total_bytes: int
    fits: bool


class FitReport(Frozen):
    target: GpuTarget
    margin_bytes: int
    estimate: Estimate
    verdicts: tuple[Verdict, ...]
    fits: bool
    max_batch: int | None
    batch_limit: str | None = Field(
        None,
        description="why the engine runs no more sequences at once than max_batch (Ollama's num_parallel)",
    )
    max_context: int | None
    context_window: int | None = Field(
        None,
        description="the model's context window (max_position_embeddings) when it, not memory, bounds "
        "max_context",
    )
    max_concurrency: float | None
    fewest_gpus: int | None
    smallest_weights: str | None
    smallest_kv_dtype: str | None
    local_gpus: tuple[int, ...] | None = Field(
        None, description="with free memory per GPU: the fewest, freest GPUs that hold the plan together"
    )
    local_tp: int | None = None
    changes: tuple[Change, ...]


def verdicts(est: Estimate, target: GpuTarget, margin: int) -> tuple[Verdict, ...]:
    if len(est.per_gpu) > target.count:
        raise GpumemInputError(
            f"the plan uses {len(est.per_gpu)} GPUs but the target has {target.count} ({target.name})",
            field="gpu",
        )
    out = []
    rt = runtime(est.engine) if est.mode == "inference" else None
    admitted = rt is None or rt.admits(est)
    for share in est.per_gpu:
        avail = target.available(share.index)
        need = share.total_bytes if rt is None else rt.needed_bytes(est, share)
        head = avail - margin - need
        ok = head >= 0 and admitted
        out.append(
            Verdict(
                gpu_index=share.index,
                role=share.role,
                needed_bytes=need,
                available_bytes=avail,
                margin_bytes=margin,
                fits=ok,
                headroom_bytes=head,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Problem:
    """What every solver step shares: the model, its files, the GPUs and the margin."""

    spec: ModelSpec
    target: GpuTarget
    margin: int
    file_weights: WeightsInventory | None

    def check(self, run: InferenceRun, target: GpuTarget | None = None) -> tuple[bool, Estimate | None]:
        """(fits, estimate) for ``run``; a run the model rejects (a value outside its field's range, tp not
        dividing the heads) does not fit."""
        checkpoint()  # every solver step passes here (core/cancel.py)
        t = target or self.target
        try:
            run = InferenceRun.model_validate(run.model_dump())
            est = t.calibrated(estimate_inference(self.spec, run, t.memory, self.file_weights))
            return all(v.fits for v in verdicts(est, t, self.margin)), est
        except (GpumemInputError, ValidationError):
            return False, None

    def fits(self, run: InferenceRun, **update: object) -> bool:
        return self.check(run.model_copy(update=update))[0]


def field_max(model: type, name: str) -> int:
    """The largest value the run model ``model`` accepts for the integer field ``name`` (its declared
    range): a solver's search never goes past it."""
    f = next(f for f in run_fields(model) if f.name == name)
    assert f.hi is not None, name
    return int(f.hi) - (1 if f.hi_open else 0)


def window_bound(spec: ModelSpec, longest: int | None) -> int | None:
    """The model's context window when the longest context (or training sequence) that fits reaches it: the
    window, not memory, is then the bound a report names."""
    window = spec.max_position_embeddings
    return window if longest is not None and longest >= window else None


def fit_report(
    spec: ModelSpec,
    run: InferenceRun,
    target: GpuTarget,
    margin: int = DEFAULT_MARGIN_BYTES,
    file_weights: WeightsInventory | None = None,
) -> FitReport:
    """Verdict per GPU, the maxima that fit, and a ranked list of changes (see module docstring).

    ``file_weights`` is the model's header inventory, used when ``run.weights == 'file'``.
    """
    if run.gpus > target.count:
        raise GpumemInputError(
            f"tp x pp = {run.gpus} GPUs but --gpu gives {target.count}; use NAME:COUNT", field="gpu"
        )
    pb = _Problem(spec, target, margin, file_weights)
    est = target.calibrated(estimate_inference(spec, run, target.memory, file_weights))
    vs = verdicts(est, target, margin)
    batch_hi = min(1 << 16, field_max(InferenceRun, "batch"))
    limit = runtime(run.engine).batch_limit(run)
    if limit is not None:
        batch_hi = min(batch_hi, limit[0])
    max_batch = largest(lambda b: pb.fits(run, batch=b), 1, batch_hi)
    # contexts up to the model's context window (prompt + new tokens: what its position embeddings or rope
    # were built for), and never a prompt the run model would reject (seq is 1 to its declared maximum)
    ctx_hi = min(spec.max_position_embeddings, run.new_tokens + field_max(InferenceRun, "seq"))
    max_ctx = (
        largest(lambda t: pb.fits(run, seq=t - run.new_tokens), run.new_tokens + 1, ctx_hi)
        if ctx_hi > run.new_tokens  # the new tokens alone may fill the window: then no prompt fits
        else None
    )
    max_concurrency = runtime(run.engine).max_concurrency(est)
    fewest = _fewest_gpus(pb, run)
    best_w = _best_format(pb, run)
    best_kv = _best_kv(pb, run)
    local = _local_choice(pb, run)
    return FitReport(
        target=target,
        margin_bytes=margin,
        estimate=est,
        verdicts=vs,
        fits=all(v.fits for v in vs),
        max_batch=max_batch,
        batch_limit=limit[1] if limit is not None and max_batch == limit[0] else None,
        max_context=max_ctx,
        # the window bounds the context that fits, or the new tokens alone fill it (no prompt fits)
        context_window=window_bound(spec, max_ctx)
        if ctx_hi > run.new_tokens
        else spec.max_position_embeddings,
        max_concurrency=max_concurrency,
        fewest_gpus=fewest,
        smallest_weights=best_w,
        smallest_kv_dtype=best_kv,
        local_gpus=local[0] if local else None,
        local_tp=local[1] if local else None,
        changes=_changes(pb, run, max_batch, max_ctx, fewest, best_w, best_kv, local),
    )


def _local_choice(pb: _Problem, run: InferenceRun) -> tuple[tuple[int, ...], int] | None:
    """Which local GPUs to use: for tensor-parallel degrees 1, 2, 4, ... the freest GPUs, until every one of
    them has room for its share (free memory - margin >= what the rank needs)."""
    free = pb.target.free_bytes
    if not free:
        return None
    order = sorted(range(len(free)), key=lambda i: -free[i])
    for tp in _tp_options(pb.spec, len(free)):
        _fits, est = pb.check(
            run.model_copy(update={"tp": tp, "pp": 1}),
            pb.target.model_copy(update={"free_bytes": None, "count": len(free)}),
        )
        if est is None:
            continue
        need = max(g.total_bytes for g in est.per_gpu)
        chosen = order[:tp]
        if all(free[i] - pb.margin >= need for i in chosen):
            return tuple(sorted(chosen)), tp
    return None


def _tp_options(spec: ModelSpec, limit: int) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= limit and spec.num_attention_heads % t == 0]


def _fewest_gpus(pb: _Problem, run: InferenceRun) -> int | None:
    """Fewest GPUs of the target's type: tensor parallel first (up to 8), then pipeline stages."""
    big = pb.target.model_copy(update={"count": 4096, "free_bytes": None})
    best = None
    for tp in _tp_options(pb.spec, 8):
        for pp in range(1, min(pb.spec.num_layers, 64) + 1):
            if best is not None and tp * pp >= best:
                break
            if pb.check(run.model_copy(update={"tp": tp, "pp": pp}), big)[0]:
                best = tp * pp
                break
    return best


def _current_bits(run: InferenceRun) -> float:
    return 64.0 if run.weights == "file" else get_weight_format(run.weights).bits


def _best_format(pb: _Problem, run: InferenceRun) -> str | None:
    """The most precise weight format strictly smaller than the run's that fits (engine's formats); None when
    the run fits as it is (a format of the same size is no change) or no smaller format fits."""
    if pb.check(run)[0]:
        return None
    fmts = [f for f in runtime(run.engine).formats() if f.bits < _current_bits(run)]
    for f in sorted(fmts, key=lambda f: -f.bits):
        if pb.fits(run, weights=f.id):
            return f.id
    return None


def _smaller_kv(run: InferenceRun) -> list[str]:
    """The engine's KV dtypes strictly smaller than the run's, most precise first."""
    current = KV_DTYPES[run.kv_dtype_resolved]
    return sorted(
        (k for k in engine_kv_dtypes(run.engine) if KV_DTYPES[k] < current), key=lambda k: -KV_DTYPES[k]
    )


def _best_kv(pb: _Problem, run: InferenceRun) -> str | None:
    """The most precise KV dtype strictly smaller than the run's that fits; None when the run fits as it is
    or none does."""
    if pb.check(run)[0]:
        return None
    return next((kv for kv in _smaller_kv(run) if pb.fits(run, kv_dtype=kv)), None)


def _changes(
    pb: _Problem,
    run: InferenceRun,
    max_batch: int | None,
    max_ctx: int | None,
    fewest: int | None,
    best_w: str | None,
    best_kv: str | None,
    local: tuple[tuple[int, ...], int] | None = None,
) -> tuple[Change, ...]:
    """Candidate changes, each re-estimated; ranked: those that fit first, then by how little they give up
    (KV quantization, weight quantization, smaller batch, more GPUs, shorter context, CPU offload)."""
    cands: list[tuple[int, str, str, dict[str, object]]] = []
    if not pb.check(run)[0]:  # a smaller format is a change only for a run that does not fit as it is
        smaller_kv = _smaller_kv(run)
        kv_choice = best_kv or (smaller_kv[-1] if smaller_kv else None)
        if kv_choice:
            cands.append((1, "kv_dtype", f"quantize the KV cache to {kv_choice}", {"kv_dtype": kv_choice}))
        # when nothing fits alone, still show what the engine's common 4-bit format would need
        w_choice = best_w or runtime(run.engine).fallback_format
        if w_choice != run.weights and get_weight_format(w_choice).bits < _current_bits(run):
            cands.append((2, "weights", f"use {w_choice} weights", {"weights": w_choice}))
    if local and (local[1] != run.tp or local[0] != tuple(range(run.gpus))):
        ids = ",".join(str(i) for i in local[0])
        desc = f"run on local GPUs {ids} (CUDA_VISIBLE_DEVICES={ids}) with tp {local[1]}"
        cands.append((0, "local_gpus", desc, {"tp": local[1], "pp": 1}))
    if max_batch is not None and max_batch < run.batch:
        cands.append((3, "batch", f"batch {max_batch} instead of {run.batch}", {"batch": max_batch}))
    if fewest is not None and fewest > run.gpus:
        tp = next((t for t in _tp_options(pb.spec, 8) if t >= min(fewest, 8)), 8)
        pp = max(1, -(-fewest // tp))
        cands.append((4, "gpus", f"{tp * pp} GPUs (tp {tp}, pp {pp})", {"tp": tp, "pp": pp}))
    if max_ctx is not None and run.new_tokens < max_ctx < run.tokens:
        seq = max_ctx - run.new_tokens
        desc = f"context {max_ctx} tokens ({seq} prompt + {run.new_tokens} new)"
        cands.append((5, "context", desc, {"seq": seq}))
    cands += runtime(run.engine).fit_levers(pb.spec, run, lambda **upd: pb.fits(run, **upd))
    out = []
    for rank, kind, desc, upd in cands:
        r = run.model_copy(update=upd)
        t = pb.target.model_copy(update={"count": max(pb.target.count, r.gpus)})
        if kind == "local_gpus" and local:
            free = pb.target.free_bytes or ()
            t = t.model_copy(update={"free_bytes": tuple(free[i] for i in local[0])})
        ok, est = pb.check(r, t)
        if est is not None:
            change = Change(kind=kind, description=desc, update=upd, total_bytes=est.total_bytes, fits=ok)
            out.append((not ok, rank, change))
    out.sort(key=lambda t: (t[0], t[1]))
    return tuple(c for *_, c in out)


def maxima_phrases(rep: FitReport) -> list[str]:
    """The maxima of ``rep`` in words, for the CLI and the window's reports: ``max batch 36``, or where
    nothing fits a sentence that says so (``no batch size fits``); the best weight format and KV dtype only
    where they name a change (a strictly smaller format that makes the run fit)."""
    train = rep.estimate.mode == "train"
    batch, ctx = ("micro-batch", "sequence") if train else ("batch", "context")
    out = [
        (
            f"max {batch} {rep.max_batch}" + (f" ({rep.batch_limit})" if rep.batch_limit is not None else "")
            if rep.max_batch is not None
            else f"no {batch} size fits"
        ),
        (
            f"{'longest sequence' if train else 'max context'} {rep.max_context:,} tokens"
            + (" (the model's context window)" if rep.context_window is not None else "")
            if rep.max_context is not None
            else f"no {ctx} length fits"
            + (
                f" (the model's context window is {rep.context_window:,} tokens)"
                if rep.context_window is not None
                else ""
            )
        ),
        f"fewest GPUs {rep.fewest_gpus}" if rep.fewest_gpus is not None else "no GPU count tried fits",
    ]
    if rep.smallest_weights is not None:
        out.append(f"best weights {rep.smallest_weights}")
    if rep.smallest_kv_dtype is not None:
        out.append(f"best KV dtype {rep.smallest_kv_dtype}")
    if rep.max_concurrency is not None:
        out.append(f"max concurrency {rep.max_concurrency:g}x")
    return out
