"""``gpumem models``, ``gpus``, ``inspect`` and ``formats``: what gpumem knows about models and GPUs."""

from __future__ import annotations

import argparse
from typing import Any

from gpumem_gui.cli.flags import encoder_line, with_task
from gpumem_gui.cli.output import dump, print_table
from gpumem_gui.cli.state_info import print_state, state_json
from gpumem_gui.core import (
    GB,
    GiB,
    GpumemInputError,
    LoadedModel,
    ModelSpec,
    cross_attention_layers,
    cross_cache_bytes,
    cross_cache_bytes_per_source_token,
    describe_compressed,
    describe_linear_attention,
    fmt_count,
    has_compressed_cache,
    kv_bytes_per_token_per_layer,
    kv_cache_bytes_transformers,
    load_gpu_catalog,
    load_model,
    model_kinds,
    search_models,
    weight_bytes,
)

INSPECT_SCHEMA = "gpumem.inspect/1"


def cmd_models(args: argparse.Namespace) -> int:
    from gpumem_gui.core import count_params

    entries = search_models(args.search or "")
    if args.json:
        dump(
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
    print_table(rows, ["id", "family", "type", "kind", "params"], right={4})
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
        dump(snapshot_to_json(snap))
    else:
        print(format_snapshot(snap))
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from gpumem_gui.cli.cluster import cluster_given, cluster_snapshot

    if cluster_given(args):
        if args.catalog or args.fake_gpus:
            raise GpumemInputError("--prometheus reads a cluster; leave out --catalog and --fake-gpus")
        from gpumem_gui.hardware import format_snapshot, snapshot_to_json

        snap = cluster_snapshot(args)
        dump(snapshot_to_json(snap)) if args.json else print(format_snapshot(snap))
        return 0 if snap.available else 1  # asked for this server: not reading it is a failure
    if not args.catalog:
        return _local_gpus(args)
    gpus = load_gpu_catalog()
    if args.json:
        dump([g.model_dump(mode="json") for g in gpus])
        return 0
    rows = [
        [
            g.id,
            g.name,
            g.vendor,
            f"{g.memory_bytes / GiB:.2f}",
            f"{g.memory_bytes / GB:.2f}",
            f"{g.cuda_memory_bytes / GiB:.2f}" + ("" if g.cuda_memory_kind == "published" else "*"),
            f"{g.bandwidth_bytes_per_s / 1e12:.2f}" if g.bandwidth_bytes_per_s else "?",
        ]
        for g in gpus
    ]
    head = ["id", "name", "vendor", "nvidia-smi GiB", "nvidia-smi GB", "CUDA GiB", "TB/s"]
    print_table(rows, head, right={3, 4, 5, 6})
    print(
        "nvidia-smi: the total the driver shows; CUDA: the total cudaMemGetInfo reports (less the driver's "
        "reserve), what vLLM, SGLang's pool, llama.cpp, Ollama and PyTorch allocate from and fit verdicts "
        "use; * derived by rule where no CUDA total is published (--json: cuda_memory_source)"
    )
    return 0


def inspect_json(m: LoadedModel) -> dict[str, Any]:
    """The stable ``gpumem inspect --json`` document (schema ``gpumem.inspect/1``)."""
    spec, p, w = m.spec, m.params, m.weights
    # an encoder keeps no KV cache: no KV figures at all
    kv_layers = (
        list(kv_bytes_per_token_per_layer(spec))
        if spec and model_kinds(spec).model != "encoder" and not has_compressed_cache(spec)
        else None
    )
    return {
        "schema": INSPECT_SCHEMA,
        "model": m.name,
        "source": m.source,
        "source_kind": m.source_kind,
        "approximate": spec.approximate if spec else None,
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
        # the format a config's quantization_config names and its bytes (the checkpoint as published)
        "checkpoint_weights": _checkpoint(m),
        "kv_cache_dtype": "bf16",
        "kv_cache_bytes_per_token": sum(kv_layers) if kv_layers else None,
        "kv_cache_bytes_per_token_per_layer": kv_layers,
        # DeepSeek-V4: no per-token figure; one sequence's cache at a few lengths (spec/compressed.py)
        **(
            {"kv_cache_bytes_per_sequence_at": _compressed_at(spec)}
            if spec and has_compressed_cache(spec)
            else {}
        ),
        # linear-attention layers' fixed conv + recurrent state per sequence (bf16 activations; spec/state.py)
        **(state_json(spec) if spec and model_kinds(spec).model != "encoder" else {}),
        # Llama 3.2 Vision: each image's vision keys and values in the cross-attention layers (0 text only)
        **({"cross_attention_cache_bytes_per_image": cross_cache_bytes(spec, 1)} if _cross(spec) else {}),
        "notes": list(m.notes),
    }


def _checkpoint(m: LoadedModel) -> dict[str, Any] | None:
    """The weight format the config's quantization_config names, with its bytes (checkpoint_quant.py)."""
    if m.spec is None or m.checkpoint_weights is None:
        return None
    wb = weight_bytes(m.spec, m.checkpoint_weights)
    return {"format": m.checkpoint_weights, "total_bytes": wb.total_bytes}


def _attention_text(spec: ModelSpec) -> str:
    """Heads of the attention; Gemma 4's full-attention layers have their own (spec/gemma4.py)."""
    text = (
        f"{spec.attention_kind}: {spec.num_attention_heads} query heads, {spec.num_kv_heads} KV heads, "
        f"head_dim {spec.head_dim}"
    )
    g = spec.gemma4
    if g is not None:
        text += f"; full layers {g.global_kv_heads} KV heads, head_dim {g.global_head_dim}"
        text += " (k = v)" if g.k_eq_v else ""
    return text


def _print_inspect(m: LoadedModel) -> None:
    spec, p, w = m.spec, m.params, m.weights
    print(f"{m.name}   ({m.source_kind}: {m.source})")
    if spec and spec.approximate:
        print(f"approximate: {spec.approximate}")
    if spec:
        arch = [
            ("model_type", spec.model_type),
            ("layers", str(spec.num_layers)),
            ("hidden size", str(spec.hidden_size)),
            ("attention", _attention_text(spec)),
            (
                "MLP",
                f"{'gated' if spec.mlp_gated else 'plain'} {spec.activation}, width {spec.intermediate_size}",
            ),
            ("vocab", f"{spec.vocab_size} ({'tied' if spec.tie_word_embeddings else 'untied'} lm_head)")
            if model_kinds(spec).model != "encoder"
            else ("encoder", encoder_line(spec)),
            ("positions", f"{spec.position_embedding}, max {spec.max_position_embeddings}"),
        ]
        if spec.sliding_window:
            n_sl = len(model_kinds(spec).layers_of("sliding_attention"))
            arch.append(
                ("sliding window", f"{spec.sliding_window} tokens on {n_sl} of {spec.num_layers} layers")
            )
        if spec.attention_chunk_size:  # Llama 4's chunked local attention
            n_ch = len(model_kinds(spec).layers_of("chunked_attention"))
            arch.append(
                (
                    "attention chunks",
                    f"{spec.attention_chunk_size} tokens on {n_ch} of {spec.num_layers} layers",
                )
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
        if spec.deepseek_v4 is not None:  # DeepSeek-V4 (spec/compressed.py)
            arch.append(("compressed attention", describe_compressed(spec)))
        if (linear := describe_linear_attention(spec)) is not None:  # hybrid models (spec/state.py)
            arch.append(("recurrent layers", linear))
        print_table(arch, ["architecture", ""])
        print()
    if p:
        rows = [[k, f"{v:,}", fmt_count(v)] for k, v in p.by_component.items() if v]
        rows.append(["total", f"{p.total:,}", fmt_count(p.total)])
        if p.routed_experts:
            rows.append(["active per token", f"{p.active_per_token:,}", fmt_count(p.active_per_token)])
        print_table(rows, ["parameters", "count", ""], right={1, 2})
        print()
    if w:
        rows = [
            [dt, f"{w.elements_by_dtype.get(dt, 0):,}", f"{b:,}", f"{b / GiB:.3f}"]
            for dt, b in sorted(w.bytes_by_dtype.items(), key=lambda kv: -kv[1])
        ]
        rows.append(["total", f"{w.total_elements:,}", f"{w.total_bytes:,}", f"{w.total_bytes / GiB:.3f}"])
        title = f"weights in {w.format} ({w.quantization or 'unquantized'})"
        print_table(rows, [title, "elements", "bytes", "GiB"], right={1, 2, 3})
        print()
    if (ck := _checkpoint(m)) is not None and not w:
        print(f"checkpoint as published ({ck['format']}, its quantization_config): {ck['total_bytes']:,} B")
        print()
    if spec and model_kinds(spec).model != "encoder":  # an encoder keeps no KV cache
        _print_cache(spec)
    for n in m.notes:
        print(f"note: {n}")


# the lengths at which inspect shows a compressed cache (no per-token figure describes it)
_COMPRESSED_LENGTHS = (4096, 131072, 1048576)


def _compressed_at(spec: Any) -> dict[str, int]:
    return {str(t): sum(kv_cache_bytes_transformers(spec, t)) for t in _COMPRESSED_LENGTHS}


def _print_cache(spec: Any) -> None:
    """The KV cache per token (an encoder-decoder: per target token, and its cross-attention cache per
    source token) and a recurrent model's fixed state."""
    if has_compressed_cache(spec):  # DeepSeek-V4's CSA / HCA layers: a rule of the length
        at = ", ".join(f"{b / (1 << 20):,.1f} MiB at {int(t):,}" for t, b in _compressed_at(spec).items())
        print(
            "KV cache (bf16, as transformers allocates it; compressed layers: a rule of the length): "
            f"{at} tokens per sequence"
        )
        return
    kv = kv_bytes_per_token_per_layer(spec)
    print(
        f"KV cache (bf16, as transformers allocates it): {sum(kv):,} bytes per token "
        f"({sum(kv) / 1024:.1f} KiB)" + (" of target (decoder self-attention)" if spec.seq2seq else "")
    )
    # EncoderDecoderCache: the cross-attention K/V of every source token
    if model_kinds(spec).model == "encoder-decoder":
        cross = cross_cache_bytes_per_source_token(spec)
        print(f"cross-attention cache (bf16): {cross:,} bytes per source token ({cross / 1024:.1f} KiB)")
    if n := _cross(spec):  # Llama 3.2 Vision's cross-attention layers (spec/cross_attention.py)
        per = cross_cache_bytes(spec, 1)
        print(
            f"cross-attention cache (bf16, {n} layers): none for text only; {per:,} bytes per image "
            f"({per / (1 << 20):.1f} MiB, --images), whatever the length"
        )
    print_state(spec)


def _cross(spec: Any) -> int:
    return cross_attention_layers(spec) if spec is not None else 0


def cmd_inspect(args: argparse.Namespace) -> int:
    m = with_task(load_model(args.model), args)
    if args.json:
        dump(inspect_json(m))
    else:
        _print_inspect(m)
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    from gpumem_gui.core import list_weight_formats

    fmts = list_weight_formats()
    if args.json:
        dump([f.model_dump(mode="json") for f in fmts])
    else:
        print_table(
            [[f.id, f"{f.bits:g}", f.label] for f in fmts], ["format", "bits", "description"], right={1}
        )
    return 0
