"""``gpumem estimate``, ``fit`` and ``sweep``: a run's memory, its verdict on GPUs, and many points."""

from __future__ import annotations

import argparse
from typing import Any

from gpumem_gui.cli.calibrate import calibrated_target
from gpumem_gui.cli.flags import loaded_spec, run_from_args, target_from_args
from gpumem_gui.cli.imports import model_and_run, print_imported
from gpumem_gui.cli.output import dump, gib, print_table
from gpumem_gui.core import (
    GpumemInputError,
    LoadedModel,
    estimate_document,
    fit_document,
    maxima_phrases,
    reported_for,
    run_fields,
    runtime,
    with_target_arch,
)


def estimate_json(m: LoadedModel, run: Any, est: Any) -> dict[str, Any]:
    """The stable ``gpumem estimate --json`` document (schema ``gpumem.estimate/1``)."""
    return estimate_document(m.name, m.params, run, est, approximate=_approximate(m))


def _approximate(m: LoadedModel) -> str | None:
    """Why the model's numbers are approximate (an architecture the readers do not model), else None."""
    return m.spec.approximate if m.spec is not None else None


def _kv_dtype(m: LoadedModel, run: Any) -> str:
    """The KV cache type the engine really uses (llama.cpp: -ctk/-ctv or its f16; Ollama: f16 unless flash
    attention lets OLLAMA_KV_CACHE_TYPE apply)."""
    return runtime(run.engine).kv_cache_dtype(m.spec, run) if m.spec is not None else run.kv_dtype_resolved


def _print_estimate(m: LoadedModel, run: Any, est: Any) -> None:
    if est.mode == "train":
        print(
            f"{m.name}: training, {run.method}, {run.precision}, {run.optimizer}, micro-batch {run.batch}, "
            f"seq {run.seq}, grad accum {run.grad_accum}, checkpointing {'on' if run.grad_ckpt else 'off'}, "
            f"attn {run.attn}, framework {run.framework}"
        )
    else:
        print(
            f"{m.name}: {est.mode}, engine {est.engine}, batch {run.batch}, prompt {run.seq}, "
            f"new {run.new_tokens}, weights {run.weights}, KV {_kv_dtype(m, run)}, attn {run.attn}"
        )
    rows = [
        [c.label, f"{c.bytes:,}", gib(c.bytes), f"{100 * c.bytes / max(1, est.total_bytes):.1f}%"]
        for c in est.components
    ]
    print_table(rows, ["component (at the peak)", "bytes", "GiB", "share"], right={1, 2, 3})
    print()
    print(
        f"peak of live tensors: {gib(est.peak_bytes)} GiB in phase '{est.peak_phase}'   "
        f"(torch.cuda.max_memory_allocated)"
    )
    print(f"GPU memory needed:    {gib(est.total_bytes)} GiB per GPU (what a fit checks)")
    if rep := reported_for(est):
        print(
            f"a GPU with room:      reserved {gib(rep.reserved_bytes)} GiB (torch.cuda.max_memory_reserved), "
            f"nvidia-smi {gib(rep.nvidia_smi_bytes)} GiB ({rep.basis})"
        )
    if est.mode != "train" and "task" not in est.facts:  # an encoder (its task head) keeps no KV cache
        print(f"KV cache:             {gib(est.kv_cache_bytes)} GiB")
    if "state_bytes" in est.facts:  # linear-attention layers: a fixed state per sequence beside the KV cache
        per_seq, per_tok = est.facts["state_bytes_per_sequence"], est.facts["kv_cache_bytes_per_token"]
        print(
            f"fixed state:          {gib(est.facts['state_bytes'])} GiB ({per_seq:,} B per sequence; "
            f"KV {per_tok:,} B per token on the attention layers)"
        )
    if "reserved_peak_bytes" in est.facts:  # training: the caching allocator model (--allocator-model)
        f = est.facts
        print(
            f"allocator (model):    {gib(f['allocator_needed_bytes'])} GiB needed at least (the cached "
            f"segments released before an out-of-memory error), fragmentation {f['fragmentation']:.1%}"
        )
    print(f"phases (GiB):         {_phase_text(est)}")
    for k, v in est.facts.items():
        if k.startswith(
            (
                "kv_tokens", "max_concurrency", "budget", "kv_pool", "cpu_bytes", "offloaded", "framework",
                "activation_offload", "nvme", "paged", "zero_state", "max_total_num_tokens",
                "max_running_requests", "mem_fraction_static", "max_mamba_cache_size",
                "state_bytes_per_request",
            )
        ):  # fmt: skip
            print(f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}")
    _print_ranks(est)
    for w in est.warnings:
        print(f"warning: {w}")


def _phase_text(est: Any) -> str:
    """Each phase's live peak, and its reserved peak where the allocator model ran."""
    return "   ".join(
        f"{n} {gib(ph.peak_bytes)}" + (f" (reserved {gib(ph.reserved_bytes)})" if ph.reserved_bytes else "")
        for n, ph in est.phases.items()
    )


def _print_ranks(est: Any) -> None:
    """A training estimate's per-rank table, when its ranks do not all hold the same."""
    if len(est.ranks) < 2:
        return
    off = est.off_gpu_columns()
    rows = []
    for r in est.ranks:
        top = ", ".join(f"{c.label} {gib(c.bytes)}" for c in r.top_components())
        mark = " *" if r.decides else ""
        sizes = [gib(r.peak_bytes), gib(r.total_bytes)]
        rows.append(
            [r.role + mark, str(r.gpus), *sizes, r.peak_phase, *(gib(getattr(r, f)) for f, _ in off), top]
        )
    heads = ["rank class", "GPUs", "peak GiB", "total GiB", "phase", *(f"{label} GiB" for _, label in off)]
    print()
    print_table(rows, [*heads, "largest components (GiB)"], right={1, 2, 3, *range(5, 5 + len(off))})
    print("* decides the fit (the most-loaded rank)")


def cmd_estimate(args: argparse.Namespace) -> int:
    m, run, imported = model_and_run(args)
    target, note = calibrated_target(target_from_args(args), run, args)
    # sized for the catalog GPU's generation (gpu_arch auto); the document keeps the run as given, as the
    # window's export does
    est = _estimate(m, with_target_arch(run, target), target.capacity_bytes if target else None)
    est = target.calibrated(est) if target else est
    rep = _fit(m, run, target, args) if target else None  # a target the run cannot use: one line, no estimate
    if args.json:
        doc = estimate_json(m, run, est)
        if imported is not None:
            doc["imported"] = imported
        if rep is not None:
            doc["fit"] = _fit_json(rep, _approximate(m))
        dump(doc)
    else:
        print_imported(imported)
        _print_note(note)
        _print_estimate(m, run, est)
        if rep is not None:
            print()
            _print_fit(rep)
    return 0


def _print_note(note: str | None) -> None:
    """The calibration applied (gpumem calibrations; --no-calibration leaves it out), before the estimate."""
    if note:
        print(f"note: {note} (--no-calibration leaves it out)")
        print()


def _estimate(m: LoadedModel, run: Any, capacity: int | None) -> Any:
    """Inference or training estimate, by the run's type."""
    from gpumem_gui.core import estimate_any

    return estimate_any(m.spec, run, capacity, m.weights)


def _fit(m: LoadedModel, run: Any, target: Any, args: argparse.Namespace) -> Any:
    from gpumem_gui.core import InferenceRun, fit_report, fit_training

    run = with_target_arch(run, target)
    if not isinstance(run, InferenceRun):
        return fit_training(m.spec, run, target, margin=args.margin_mib << 20)

    return fit_report(m.spec, run, target, margin=args.margin_mib << 20, file_weights=m.weights)


def _fit_json(rep: Any, approximate: str | None) -> dict[str, Any]:
    return fit_document(rep, approximate)


def _print_fit(rep: Any) -> None:
    t = rep.target
    each = f"{gib(t.cuda_capacity)} GiB each as CUDA reports it"
    if t.cuda_capacity != t.capacity_bytes:
        each += f", {gib(t.capacity_bytes)} GiB in nvidia-smi"
    print(f"fit on {t.count} x {t.name} ({each}; margin {gib(rep.margin_bytes)} GiB):")
    for v in rep.verdicts:
        print(
            f"  GPU {v.gpu_index} ({v.role}): needs {gib(v.needed_bytes)} of "
            f"{gib(v.available_bytes)} GiB: {v.words()}"
        )
    rank = rep.estimate.deciding_rank()
    if rank is not None and len(rep.estimate.ranks) > 1:
        print(f"  decided by: {rank.role} (needs {gib(rank.total_bytes)} GiB, peak in {rank.peak_phase})")
    print("  " + ", ".join(maxima_phrases(rep)))
    if rep.local_gpus is not None:
        print(f"  local GPUs that hold it: {', '.join(map(str, rep.local_gpus))} (tp {rep.local_tp})")
    if rep.changes:
        print("  to make it fit (ranked):" if not rep.fits else "  other options:")
        for c in rep.changes:
            print(f"    {'+' if c.fits else '-'} {c.description}: {gib(c.total_bytes)} GiB")


def cmd_fit(args: argparse.Namespace) -> int:
    from gpumem_gui.cli.cluster import cluster_given

    cluster = cluster_given(args)
    if not args.gpu and not args.local and args.fake_gpus is None and not cluster:
        raise GpumemInputError(
            "fit needs --gpu NAME[:COUNT] or CAPACITY[:COUNT] (24GiB, 80GB:4), --local or --prometheus URL",
            field="gpu",
        )
    m, run, imported = model_and_run(args)
    if cluster:
        return _fit_cluster(m, run, args)
    target, note = calibrated_target(target_from_args(args), run, args)
    rep = _fit(m, run, target, args)
    if args.json:
        doc = _fit_json(rep, _approximate(m))
        if imported is not None:
            doc["imported"] = imported
        dump(doc)
    else:
        print_imported(imported)
        _print_note(note)
        _print_estimate(m, run, rep.estimate)
        print()
        _print_fit(rep)
    return 0


def _fit_cluster(m: LoadedModel, run: Any, args: argparse.Namespace) -> int:
    """``fit --prometheus``: the usual report (on --gpu, or the cluster's most common GPU) plus ``cluster``:
    the ranked placements of the whole plan on the GPUs' free memory now."""
    from gpumem_gui.cli.cluster import cluster_fit_for, cluster_snapshot, cluster_target, print_cluster
    from gpumem_gui.core import cluster_document
    from gpumem_gui.hardware.cluster import cluster_gpus

    snap = cluster_snapshot(args)
    if not snap.available:
        reason = snap.unavailable_reason
        raise GpumemInputError(f"no cluster GPUs to check against: {reason}", field="prometheus")
    target = target_from_args(args) or cluster_target(cluster_gpus(snap), run.tp * run.pp)
    target, note = calibrated_target(target, run, args)
    rep = _fit(m, run, target, args)
    cf = cluster_fit_for(m, run, args, snap)
    if args.json:
        dump({**_fit_json(rep, _approximate(m)), "cluster": cluster_document(cf)})
    else:
        _print_note(note)
        _print_estimate(m, run, rep.estimate)
        print()
        _print_fit(rep)
        print()
        print_cluster(cf, snap)
    return 0


def _sweep_range(args: argparse.Namespace) -> None:
    """--from and --to within the range the run model takes for --over (1 to its declared maximum)."""
    from gpumem_gui.cli.flags import MODES

    f = next(f for f in run_fields(MODES[args.mode]) if f.name == args.over)
    hi = int(f.hi or 0)
    for flag, v in (("from", args.start), ("to", args.stop)):
        if not 1 <= v <= hi:
            raise GpumemInputError(f"--over {args.over} takes 1 to {hi:,}, got {v:,}", field=flag)
    if args.stop < args.start:
        raise GpumemInputError(f"--to ({args.stop:,}) is below --from ({args.start:,})", field="to")


def cmd_sweep(args: argparse.Namespace) -> int:
    from gpumem_gui.cli.progress import sweep_progress
    from gpumem_gui.core import check_sweep_size, evenly_spaced, sweep

    m = loaded_spec(args.model, args)
    base = run_from_args(args, m)
    check_sweep_size(base, args.steps, m.spec.num_layers)
    _sweep_range(args)
    target, note = calibrated_target(target_from_args(args), base, args)
    if note and not (args.json or args.csv):
        _print_note(note)
    base = with_target_arch(base, target)
    xs = evenly_spaced(args.start, args.stop, args.steps)
    with sweep_progress(base, len(xs), quiet=args.json or args.csv) as progress:
        margin = args.margin_mib << 20
        points = sweep(m.spec, base, args.over, xs, target, margin, m.weights, progress=progress)
    rows = [
        {
            args.over: p.x,
            "peak_bytes": p.peak_bytes,
            "total_bytes": p.total_bytes,
            "kv_cache_bytes": p.kv_cache_bytes,
            "peak_phase": p.peak_phase,
            **({"fits": p.fits} if target else {}),
        }
        for p in points
    ]
    if args.json:
        doc = {"schema": "gpumem.sweep/1", "model": m.name, "approximate": _approximate(m)}
        dump({**doc, "over": args.over, "points": rows})
    elif args.csv:
        keys = list(rows[0])
        print(",".join(keys))
        for r in rows:
            print(",".join(str(r[k]) for k in keys))
    else:
        print_table(
            [
                [
                    str(r[args.over]),
                    gib(r["peak_bytes"]),
                    gib(r["total_bytes"]),
                    gib(r["kv_cache_bytes"]),
                    r["peak_phase"],
                ]
                + ([("yes" if r["fits"] else "no")] if target else [])
                for r in rows
            ],
            [args.over, "peak GiB", "total GiB", "KV GiB", "peak phase"] + (["fits"] if target else []),
            right={1, 2, 3},
        )
        if _approximate(m):
            print(f"warning: approximate: {_approximate(m)}")
    return 0
