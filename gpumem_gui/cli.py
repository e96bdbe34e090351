"""``gpumem``: the command-line interface over the same core as the window.

Every command has ``--json`` (stable keys, documented in README.md). Bad input prints one line
``gpumem: error: ...`` naming the file or field, and exits with status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from gpumem_gui import __version__
from gpumem_gui.core import (
    GB,
    GiB,
    GpumemError,
    LoadedModel,
    estimate_document,
    fit_document,
    fmt_count,
    kv_bytes_per_token_per_layer,
    load_gpu_catalog,
    load_model,
    search_models,
)

INSPECT_SCHEMA = "gpumem.inspect/1"
EXIT_BAD_INPUT = 2


def _print_table(
    rows: Sequence[Sequence[str]], headers: Sequence[str], right: set[int] | None = None
) -> None:
    right = right or set()
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def _dump(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


# ---- models ------------------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    from gpumem_gui.core import count_params

    entries = search_models(args.search or "")
    if args.json:
        _dump(
            [
                {
                    "id": e.id,
                    "family": e.family,
                    "size_label": e.size_label,
                    "moe": e.moe,
                    "model_type": e.spec.model_type,
                    "params_total": count_params(e.spec).total,
                    "published_params": e.published_params,
                    "source": e.source,
                }
                for e in entries
            ]
        )
        return 0
    if not entries:
        print(f"no catalog model matches {args.search!r}")
        return 0
    rows = []
    for e in entries:
        c = count_params(e.spec)
        rows.append([e.id, e.family, e.spec.model_type, "MoE" if e.moe else "dense", fmt_count(c.total)])
    _print_table(rows, ["id", "family", "type", "kind", "params"], right={4})
    return 0


# ---- gpus --------------------------------------------------------------------------------------------


def _local_gpus(args: argparse.Namespace) -> int:
    from gpumem_gui.hardware import default_backend, format_snapshot, snapshot_to_json

    backend = default_backend(args.fake_gpus)
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    if args.json:
        _dump(snapshot_to_json(snap))
    else:
        print(format_snapshot(snap))
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    if not args.catalog:
        return _local_gpus(args)
    gpus = load_gpu_catalog()
    if args.json:
        _dump([g.model_dump(mode="json") for g in gpus])
        return 0
    rows = [
        [
            g.id,
            g.name,
            g.vendor,
            f"{g.memory_bytes / GiB:.2f}",
            f"{g.memory_bytes / GB:.2f}",
            f"{g.bandwidth_bytes_per_s / 1e12:.2f}" if g.bandwidth_bytes_per_s else "?",
        ]
        for g in gpus
    ]
    _print_table(rows, ["id", "name", "vendor", "GiB", "GB", "TB/s"], right={3, 4, 5})
    return 0


# ---- inspect -----------------------------------------------------------------------------------------


def inspect_json(m: LoadedModel) -> dict[str, Any]:
    """The stable ``gpumem inspect --json`` document (schema ``gpumem.inspect/1``)."""
    spec, p, w = m.spec, m.params, m.weights
    kv_layers = list(kv_bytes_per_token_per_layer(spec)) if spec else None
    return {
        "schema": INSPECT_SCHEMA,
        "model": m.name,
        "source": m.source,
        "source_kind": m.source_kind,
        "architecture": spec.model_dump(mode="json", exclude={"provenance"}) if spec else None,
        "attention_kind": spec.attention_kind if spec else None,
        "provenance": spec.provenance.model_dump(mode="json") if spec else None,
        "params": (
            {
                "total": p.total,
                "text": p.text,
                "embedding": p.embedding,
                "position_embedding": p.position_embedding,
                "lm_head": p.lm_head,
                "lm_head_tied": p.lm_head_tied,
                "routed_experts": p.routed_experts,
                "active_per_token": p.active_per_token,
                "vision": p.vision,
                "by_component": p.by_component,
            }
            if p
            else None
        ),
        "weights_bytes_by_dtype": dict(w.bytes_by_dtype) if w else None,
        "weights": (
            {
                "format": w.format,
                "files": list(w.files),
                "tensor_count": w.tensor_count,
                "total_bytes": w.total_bytes,
                "total_elements": w.total_elements,
                "elements_by_dtype": dict(w.elements_by_dtype),
                "bytes_by_component": dict(w.bytes_by_component),
                "quantization": w.quantization,
            }
            if w
            else None
        ),
        "kv_cache_dtype": "bf16",
        "kv_cache_bytes_per_token": sum(kv_layers) if kv_layers else None,
        "kv_cache_bytes_per_token_per_layer": kv_layers,
        "notes": list(m.notes),
    }


def _print_inspect(m: LoadedModel) -> None:
    spec, p, w = m.spec, m.params, m.weights
    print(f"{m.name}   ({m.source_kind}: {m.source})")
    if spec:
        arch = [
            ("model_type", spec.model_type),
            ("layers", str(spec.num_layers)),
            ("hidden size", str(spec.hidden_size)),
            (
                "attention",
                f"{spec.attention_kind}: {spec.num_attention_heads} query heads, "
                f"{spec.num_kv_heads} KV heads, "
                f"head_dim {spec.head_dim}",
            ),
            (
                "MLP",
                f"{'gated' if spec.mlp_gated else 'plain'} {spec.activation}, width {spec.intermediate_size}",
            ),
            ("vocab", f"{spec.vocab_size} ({'tied' if spec.tie_word_embeddings else 'untied'} lm_head)"),
            ("positions", f"{spec.position_embedding}, max {spec.max_position_embeddings}"),
        ]
        if spec.sliding_window:
            n_sl = spec.resolved_layer_types.count("sliding_attention")
            arch.append(
                ("sliding window", f"{spec.sliding_window} tokens on {n_sl} of {spec.num_layers} layers")
            )
        if spec.moe:
            arch.append(
                (
                    "MoE",
                    f"{spec.moe.num_experts} experts, top-{spec.moe.experts_per_token}, expert width "
                    f"{spec.moe.expert_intermediate_size}, {spec.num_moe_layers} MoE layers",
                )
            )
        if spec.mla:
            arch.append(("MLA", f"kv_lora_rank {spec.mla.kv_lora_rank}, q_lora_rank {spec.mla.q_lora_rank}"))
        _print_table(arch, ["architecture", ""])
        print()
    if p:
        rows = [[k, f"{v:,}", fmt_count(v)] for k, v in p.by_component.items() if v]
        rows.append(["total", f"{p.total:,}", fmt_count(p.total)])
        if p.routed_experts:
            rows.append(["active per token", f"{p.active_per_token:,}", fmt_count(p.active_per_token)])
        _print_table(rows, ["parameters", "count", ""], right={1, 2})
        print()
    if w:
        rows = [
            [dt, f"{w.elements_by_dtype.get(dt, 0):,}", f"{b:,}", f"{b / GiB:.3f}"]
            for dt, b in sorted(w.bytes_by_dtype.items(), key=lambda kv: -kv[1])
        ]
        rows.append(["total", f"{w.total_elements:,}", f"{w.total_bytes:,}", f"{w.total_bytes / GiB:.3f}"])
        title = f"weights in {w.format} ({w.quantization or 'unquantized'})"
        _print_table(rows, [title, "elements", "bytes", "GiB"], right={1, 2, 3})
        print()
    if spec:
        kv = kv_bytes_per_token_per_layer(spec)
        print(
            f"KV cache (bf16, as transformers allocates it): {sum(kv):,} bytes per token "
            f"({sum(kv) / 1024:.1f} KiB)"
        )
    for n in m.notes:
        print(f"note: {n}")


def cmd_inspect(args: argparse.Namespace) -> int:
    m = load_model(args.model)
    if args.json:
        _dump(inspect_json(m))
    else:
        _print_inspect(m)
    return 0


# ---- estimate / fit / sweep --------------------------------------------------------------------------


def _add_run_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("model", help="catalog id, config.json, model folder, .safetensors, .gguf or hub id")
    sp.add_argument("--mode", choices=["inference", "train"], default="inference")
    tr = sp.add_argument_group("training (--mode train)")
    tr.add_argument("--method", choices=["full", "lora", "qlora"], default="full")
    tr.add_argument(
        "--precision", choices=["amp-bf16", "amp-fp16", "bf16", "fp32", "megatron-bf16"], default="amp-bf16"
    )
    tr.add_argument(
        "--optimizer",
        default="adamw",
        help="adamw (torch's CUDA default, foreach), adamw-fused, adamw-foreach, adamw-for-loop, adamw-8bit, "
        "paged-adamw-8bit, adafactor, sgd, sgd-momentum, lion",
    )
    tr.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    tr.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (non-reentrant)")
    tr.add_argument("--lora-rank", type=int, default=16)
    tr.add_argument(
        "--lora-targets", default="all-linear", help="all-linear or a comma list: q_proj,v_proj,..."
    )
    tr.add_argument("--lora-dropout", type=float, default=0.0)
    tr.add_argument("--qlora-base", choices=["nf4", "nf4-dq"], default="nf4")
    tr.add_argument("--frozen-layers", type=int, default=0, help="first decoder layers kept frozen")
    tr.add_argument("--zero", type=int, default=0, help="DeepSpeed ZeRO stage 0-3")
    tr.add_argument("--offload", choices=["none", "optimizer", "optimizer+params"], default="none")
    tr.add_argument("--fsdp", choices=["none", "full_shard", "shard_grad_op", "hybrid_shard"], default="none")
    tr.add_argument("--dp", type=int, default=1, help="data parallel degree")
    tr.add_argument("--cp", type=int, default=1, help="context parallel degree")
    tr.add_argument(
        "--first-step", action="store_true", help="the first step (optimizer states created in it)"
    )
    sp.add_argument("--batch", type=int, default=1, help="sequences per batch (default 1)")
    sp.add_argument("--seq", type=int, default=2048, help="prompt tokens per sequence (default 2048)")
    sp.add_argument("--new-tokens", type=int, default=0, help="generated tokens per sequence (default 0)")
    sp.add_argument(
        "--weights",
        default=None,
        help="weight format (gpumem formats lists them); default: the model files' own bytes when "
        "safetensors/GGUF files were given ('file'), else bf16",
    )
    sp.add_argument("--compute-dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    sp.add_argument("--kv-dtype", default="auto", help="KV-cache dtype (default: the compute dtype)")
    sp.add_argument("--attn", choices=["sdpa", "eager", "flash"], default="sdpa")
    sp.add_argument(
        "--logits",
        choices=["last", "all"],
        default="last",
        help="keep logits for the last position (generate) or all positions (eval forward)",
    )
    sp.add_argument("--engine", choices=["transformers", "vllm", "llama.cpp"], default="transformers")
    sp.add_argument("--tp", type=int, default=1, help="tensor parallel degree")
    sp.add_argument("--pp", type=int, default=1, help="pipeline parallel degree")
    sp.add_argument("--ep", type=int, default=1, help="expert parallel degree (MoE)")
    sp.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM (default 0.9)")
    sp.add_argument("--max-num-seqs", type=int, default=256, help="vLLM (default 256)")
    sp.add_argument("--max-model-len", type=int, default=None, help="vLLM (default: seq + new tokens)")
    sp.add_argument("--max-num-batched-tokens", type=int, default=None, help="vLLM (default 8192)")
    sp.add_argument("--enforce-eager", action="store_true", help="vLLM: no CUDA graphs")
    sp.add_argument(
        "--n-gpu-layers", "-ngl", type=int, default=-1, help="llama.cpp layers on the GPU (-1: all)"
    )
    sp.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp physical batch (default 512)")
    sp.add_argument("--no-flash-attn", action="store_true", help="llama.cpp without flash attention")
    sp.add_argument(
        "--cuda-context-mib", type=int, default=500, help="CUDA context per process (default 500)"
    )
    sp.add_argument("--gpu", default=None, help="catalog GPU, NAME or NAME:COUNT (e.g. H100-80GB:4)")
    sp.add_argument(
        "--local", action="store_true", help="check against the local GPUs' free memory now (NVML)"
    )
    sp.add_argument("--fake-gpus", metavar="FILE", help="with --local: a fake-GPU scenario instead of NVML")
    sp.add_argument("--json", action="store_true", help="machine-readable output")


def _run_from_args(args: argparse.Namespace, m: LoadedModel) -> Any:
    from gpumem_gui.core import make_run

    weights = args.weights or ("file" if m.weights is not None else "bf16")
    if args.mode == "train":
        from gpumem_gui.core import make_training_run

        targets = (
            args.lora_targets
            if args.lora_targets == "all-linear"
            else tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
        )
        return make_training_run(
            method=args.method,
            precision=args.precision,
            optimizer=args.optimizer,
            batch=args.batch,
            seq=args.seq,
            grad_accum=args.grad_accum,
            grad_ckpt=args.grad_ckpt,
            attn=args.attn,
            lora_rank=args.lora_rank,
            lora_targets=targets,
            lora_dropout=args.lora_dropout,
            qlora_base=args.qlora_base,
            frozen_layers=args.frozen_layers,
            zero=args.zero,
            offload=args.offload,
            fsdp=args.fsdp,
            dp=args.dp,
            tp=args.tp,
            pp=args.pp,
            ep=args.ep,
            cp=args.cp,
            first_step=args.first_step,
            cuda_context_mib=args.cuda_context_mib,
        )
    return make_run(
        batch=args.batch,
        seq=args.seq,
        new_tokens=args.new_tokens,
        weights=weights,
        compute_dtype=args.compute_dtype,
        kv_dtype=args.kv_dtype,
        attn=args.attn,
        logits=args.logits,
        engine=args.engine,
        tp=args.tp,
        pp=args.pp,
        ep=args.ep,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enforce_eager=args.enforce_eager,
        n_gpu_layers=args.n_gpu_layers,
        n_ubatch=args.n_ubatch,
        n_batch=max(2048, args.n_ubatch),
        flash_attn=not args.no_flash_attn,
        cuda_context_mib=args.cuda_context_mib,
    )


def _local_target(fake: str | None) -> Any:
    """The CUDA-visible local GPUs as a fit target: the smallest total as capacity, free memory per GPU."""
    from gpumem_gui.core import GpumemInputError, GpuTarget
    from gpumem_gui.hardware import default_backend

    backend = default_backend(fake)
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    if not snap.available:
        raise GpumemInputError(f"no local GPU to check against: {snap.unavailable_reason}", field="local")
    devs = [d for d in snap.cuda_devices if d.ok and d.total_bytes]
    if not devs:
        raise GpumemInputError("no usable local GPU (none visible to CUDA, or all lost)", field="local")
    names = {d.name for d in devs}
    return GpuTarget(
        name=devs[0].name if len(names) == 1 else "local GPUs (mixed)",
        capacity_bytes=min(d.total_bytes for d in devs),
        count=len(devs),
        free_bytes=tuple(d.free_bytes or 0 for d in devs),
    )


def _target_from_args(args: argparse.Namespace) -> Any:
    return _local_target(args.fake_gpus) if args.local else _target(args.gpu)


def _target(spec_gpu: str | None) -> Any:
    from gpumem_gui.core import GpumemInputError, GpuTarget, find_gpu

    if not spec_gpu:
        return None
    name, _, count = spec_gpu.partition(":")
    n = 1
    if count:
        if not count.isdigit() or int(count) < 1:
            raise GpumemInputError(f"GPU count must be a positive integer, got {count!r}", field="gpu")
        n = int(count)
    g = find_gpu(name)
    return GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=n)


def _loaded_spec(model: str) -> Any:
    from gpumem_gui.core import GpumemInputError

    m = load_model(model)
    if m.spec is None:
        raise GpumemInputError(
            "the architecture is unknown (no config.json); estimates need it", source=model
        )
    return m


def estimate_json(m: LoadedModel, run: Any, est: Any) -> dict[str, Any]:
    """The stable ``gpumem estimate --json`` document (schema ``gpumem.estimate/1``)."""
    return estimate_document(m.name, m.params, run, est)


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def _print_estimate(m: LoadedModel, run: Any, est: Any) -> None:
    if est.mode == "train":
        print(
            f"{m.name}: training, {run.method}, {run.precision}, {run.optimizer}, micro-batch {run.batch}, "
            f"seq {run.seq}, grad accum {run.grad_accum}, checkpointing {'on' if run.grad_ckpt else 'off'}, "
            f"attn {run.attn}"
        )
    else:
        print(
            f"{m.name}: {est.mode}, engine {est.engine}, batch {run.batch}, prompt {run.seq}, "
            f"new {run.new_tokens}, weights {run.weights}, KV {run.kv_dtype_resolved}, attn {run.attn}"
        )
    rows = [
        [c.label, f"{c.bytes:,}", _gib(c.bytes), f"{100 * c.bytes / max(1, est.total_bytes):.1f}%"]
        for c in est.components
    ]
    _print_table(rows, ["component (at the peak)", "bytes", "GiB", "share"], right={1, 2, 3})
    print()
    print(
        f"peak of live tensors: {_gib(est.peak_bytes)} GiB in phase '{est.peak_phase}'   "
        f"(torch.cuda.max_memory_allocated)"
    )
    print(f"GPU memory needed:    {_gib(est.total_bytes)} GiB per GPU (what nvidia-smi shows)")
    if est.mode != "train":
        print(f"KV cache:             {_gib(est.kv_cache_bytes)} GiB")
    phases = "   ".join(f"{n} {_gib(ph.peak_bytes)}" for n, ph in est.phases.items())
    print(f"phases (GiB):         {phases}")
    for k, v in est.facts.items():
        if k.startswith(("kv_tokens", "max_concurrency", "budget", "kv_pool", "cpu_bytes", "offloaded")):
            print(f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}")
    for w in est.warnings:
        print(f"warning: {w}")


def cmd_estimate(args: argparse.Namespace) -> int:
    m = _loaded_spec(args.model)
    run = _run_from_args(args, m)
    target = _target_from_args(args)
    est = _estimate(m, run, target.capacity_bytes if target else None)
    if args.json:
        doc = estimate_json(m, run, est)
        if target:
            doc["fit"] = _fit_json(_fit(m, run, target, args))
        _dump(doc)
    else:
        _print_estimate(m, run, est)
        if target:
            print()
            _print_fit(_fit(m, run, target, args))
    return 0


def _estimate(m: LoadedModel, run: Any, capacity: int | None) -> Any:
    """Inference or training estimate, by the run's type."""
    from gpumem_gui.core import estimate_any

    return estimate_any(m.spec, run, capacity, m.weights)


def _fit(m: LoadedModel, run: Any, target: Any, args: argparse.Namespace) -> Any:
    from gpumem_gui.core import InferenceRun, fit_report, fit_training

    if not isinstance(run, InferenceRun):
        return fit_training(m.spec, run, target, margin=args.margin_mib << 20)

    return fit_report(m.spec, run, target, margin=args.margin_mib << 20, file_weights=m.weights)


def _fit_json(rep: Any) -> dict[str, Any]:
    return fit_document(rep)


def _print_fit(rep: Any) -> None:
    t = rep.target
    print(
        f"fit on {t.count} x {t.name} ({_gib(t.capacity_bytes)} GiB each, "
        f"margin {_gib(rep.margin_bytes)} GiB):"
    )
    for v in rep.verdicts:
        state = (
            f"fits with {_gib(v.headroom_bytes)} GiB headroom"
            if v.fits
            else f"misses by {_gib(-v.headroom_bytes)} GiB"
        )
        print(
            f"  GPU {v.gpu_index} ({v.role}): needs {_gib(v.needed_bytes)} of "
            f"{_gib(v.available_bytes)} GiB: {state}"
        )
    maxima = [
        f"max batch {rep.max_batch}",
        f"max context {rep.max_context} tokens",
        f"fewest GPUs {rep.fewest_gpus}",
    ]
    if rep.smallest_weights is not None:
        maxima.append(f"best weights {rep.smallest_weights}")
    if rep.smallest_kv_dtype is not None:
        maxima.append(f"best KV dtype {rep.smallest_kv_dtype}")
    if rep.max_concurrency is not None:
        maxima.append(f"max concurrency {rep.max_concurrency}x")
    print("  " + ", ".join(maxima))
    if rep.local_gpus is not None:
        print(f"  local GPUs that hold it: {', '.join(map(str, rep.local_gpus))} (tp {rep.local_tp})")
    if rep.changes:
        print("  to make it fit (ranked):" if not rep.fits else "  other options:")
        for c in rep.changes:
            print(f"    {'+' if c.fits else '-'} {c.description}: {_gib(c.total_bytes)} GiB")


def cmd_fit(args: argparse.Namespace) -> int:
    from gpumem_gui.core import GpumemInputError

    if not args.gpu and not args.local:
        raise GpumemInputError("fit needs --gpu NAME[:COUNT] or --local", field="gpu")
    m = _loaded_spec(args.model)
    run = _run_from_args(args, m)
    rep = _fit(m, run, _target_from_args(args), args)
    if args.json:
        _dump(_fit_json(rep))
    else:
        _print_estimate(m, run, rep.estimate)
        print()
        _print_fit(rep)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from gpumem_gui.core import GpumemInputError, evenly_spaced, sweep

    m = _loaded_spec(args.model)
    base = _run_from_args(args, m)
    target = _target_from_args(args)
    if args.steps < 1 or args.steps > 100_000:
        raise GpumemInputError("must be between 1 and 100000", field="steps")
    if args.start < 1 or args.stop < args.start:
        raise GpumemInputError("need 1 <= --from <= --to", field="from")
    points = sweep(
        m.spec,
        base,
        args.over,
        evenly_spaced(args.start, args.stop, args.steps),
        target,
        args.margin_mib << 20,
        m.weights,
    )
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
        _dump({"schema": "gpumem.sweep/1", "model": m.name, "over": args.over, "points": rows})
    elif args.csv:
        keys = list(rows[0])
        print(",".join(keys))
        for r in rows:
            print(",".join(str(r[k]) for k in keys))
    else:
        _print_table(
            [
                [
                    str(r[args.over]),
                    _gib(r["peak_bytes"]),
                    _gib(r["total_bytes"]),
                    _gib(r["kv_cache_bytes"]),
                    r["peak_phase"],
                ]
                + ([("yes" if r["fits"] else "no")] if target else [])
                for r in rows
            ],
            [args.over, "peak GiB", "total GiB", "KV GiB", "peak phase"] + (["fits"] if target else []),
            right={1, 2, 3},
        )
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    from gpumem_gui.core import list_weight_formats

    fmts = list_weight_formats()
    if args.json:
        _dump([f.model_dump(mode="json") for f in fmts])
    else:
        _print_table(
            [[f.id, f"{f.bits:g}", f.label] for f in fmts], ["format", "bits", "description"], right={1}
        )
    return 0


# ---- entry point -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpumem",
        description="Will this model, in this setup, fit on my GPUs? What is eating the memory?",
    )
    p.add_argument("--version", action="version", version=f"gpumem {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("models", help="list the built-in model catalog")
    sp.add_argument("--search", metavar="TEXT", help="only models whose id, family or size contains TEXT")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_models)

    sp = sub.add_parser("gpus", help="the local GPUs through NVML (or the built-in catalog with --catalog)")
    sp.add_argument("--catalog", action="store_true", help="the built-in accelerator catalog")
    sp.add_argument(
        "--fake-gpus",
        metavar="FILE",
        help="read a fake-GPU scenario (JSON file, or a shipped name such as a100_mig) instead of NVML",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_gpus)

    sp = sub.add_parser("inspect", help="architecture, exact parameters, weight bytes and KV cost of a model")
    sp.add_argument(
        "model",
        help="catalog id, config.json, model folder, .safetensors, .gguf, or Hugging Face hub id (org/name)",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("estimate", help="memory of a run: components, phases, per GPU, with explanations")
    _add_run_flags(sp)
    sp.add_argument("--margin-mib", type=int, default=1024, help="safety margin per GPU (default 1024 MiB)")
    sp.set_defaults(func=cmd_estimate)

    sp = sub.add_parser("fit", help="does the run fit on --gpu; the maxima that fit; ranked changes")
    _add_run_flags(sp)
    sp.add_argument("--margin-mib", type=int, default=1024, help="safety margin per GPU (default 1024 MiB)")
    sp.set_defaults(func=cmd_fit)

    sp = sub.add_parser("sweep", help="estimates at evenly spaced batch sizes or sequence lengths")
    _add_run_flags(sp)
    sp.add_argument("--over", choices=["seq", "batch"], required=True)
    sp.add_argument("--from", dest="start", type=int, required=True)
    sp.add_argument("--to", dest="stop", type=int, required=True)
    sp.add_argument("--steps", type=int, default=16)
    sp.add_argument("--csv", action="store_true", help="CSV output")
    sp.add_argument("--margin-mib", type=int, default=1024, help="safety margin per GPU (default 1024 MiB)")
    sp.set_defaults(func=cmd_sweep)

    sp = sub.add_parser("formats", help="weight formats gpumem knows")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_formats)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except GpumemError as e:
        print(f"gpumem: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `gpumem models | head`
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
