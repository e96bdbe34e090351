"""Inference memory: ``estimate_inference(spec, run) -> Estimate``.

Phases (transformers runtime profile, the default):

* ``load``: the weights (in the chosen format) and the model's buffers;
* ``prefill``: one forward over the prompt, replayed op by op (:mod:`gpumem_gui.core.replay.forward`);
* ``decode``: the last generation step (one token after ``seq + new_tokens - 1`` cached tokens), plus what
  ``generate()`` keeps (fp32 copies of the last logits).

``peak_bytes`` is the largest live-tensor total over the phases on the most-loaded GPU (what
``torch.cuda.max_memory_allocated()`` reports); ``total_bytes`` adds the CUDA context, the cuBLAS workspace
and the caching allocator's reserve (:mod:`gpumem_gui.core.results.overheads`). vLLM and llama.cpp have
their own profiles (:mod:`gpumem_gui.core.runtimes.engines`).
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.formats import (
    WeightBytes,
    check_kv_dtype,
    get_weight_format,
    kv_bytes_per_element,
    weight_bytes,
)
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.replay.forward import KINDS, ForwardResult, replay_forward
from gpumem_gui.core.replay.model import ReplayConfig, buffers_bytes
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase, tp_ranks
from gpumem_gui.core.results.overheads import stage_share
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, rank_spec, stage_layers
from gpumem_gui.core.spec.params import COMPONENTS, count_params

Engine = Literal["transformers", "vllm", "llama.cpp"]
Degree = Annotated[int, Field(ge=1, le=4096)]

COMPUTE_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_REPLAY_DTYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "f32"}


class InferenceRun(Frozen):
    """Everything about an inference run that changes its memory (validated; see field descriptions)."""

    batch: Annotated[int, Field(ge=1, le=1 << 20, description="sequences processed together")] = 1
    seq: Annotated[int, Field(ge=1, le=1 << 24, description="prompt tokens per sequence")] = 2048
    new_tokens: Annotated[int, Field(ge=0, le=1 << 24, description="generated tokens per sequence")] = 0
    weights: str = Field(
        "bf16",
        description="weight format id (see `gpumem formats`), or 'file' for the bytes in the model's files",
    )
    compute_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    kv_dtype: str = Field("auto", description="KV-cache dtype; auto = the compute dtype")
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    logits: Literal["last", "all"] = "last"
    engine: Engine = "transformers"
    tp: Degree = 1
    pp: Degree = 1
    ep: Degree = 1
    # vLLM knobs
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_num_seqs: Annotated[int, Field(ge=1, le=1 << 16)] = 256
    max_model_len: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    enforce_eager: bool = False
    # llama.cpp knobs
    n_gpu_layers: Annotated[int, Field(ge=-1, le=4096)] = -1
    n_batch: Annotated[int, Field(ge=1, le=1 << 20)] = 2048
    n_ubatch: Annotated[int, Field(ge=1, le=1 << 20)] = 512
    flash_attn: bool = True
    # overheads
    cuda_context_mib: Annotated[int, Field(ge=0, le=1 << 16)] = 500

    @model_validator(mode="after")
    def _check(self) -> InferenceRun:
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must be at most n_batch ({self.n_batch})")
        return self

    @property
    def tokens(self) -> int:
        return self.seq + self.new_tokens

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def dt(self) -> int:
        return COMPUTE_DTYPE_BYTES[self.compute_dtype]

    @property
    def kv_dtype_resolved(self) -> str:
        return self.compute_dtype if self.kv_dtype == "auto" else self.kv_dtype


def make_run(**fields: object) -> InferenceRun:
    """Build an :class:`InferenceRun`; a bad value is one :class:`GpumemInputError` naming the field."""
    try:
        return InferenceRun(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise describe_validation_error(e, source="run") from None


def check_run(spec: ModelSpec, run: InferenceRun) -> tuple[str, ...]:
    """Cross-checks of run against model: errors raise, soft problems come back as warnings."""
    warnings: list[str] = []
    check_kv_dtype(run.engine, run.kv_dtype_resolved)
    if spec.num_attention_heads % run.tp:
        raise GpumemInputError(
            f"tensor parallel degree {run.tp} does not divide the {spec.num_attention_heads} attention heads",
            field="tp",
        )
    if run.pp > spec.num_layers:
        raise GpumemInputError(f"pipeline degree {run.pp} exceeds the {spec.num_layers} layers", field="pp")
    if spec.num_layers % run.pp:
        warnings.append(
            f"pp: {run.pp} stages do not divide {spec.num_layers} layers; the first stages get "
            f"{ceil(spec.num_layers / run.pp)} layers (the estimate uses the fullest stage)"
        )
    if run.ep > 1:
        if spec.moe is None:
            raise GpumemInputError("expert parallelism needs a mixture-of-experts model", field="ep")
        if spec.moe.num_experts % run.ep:
            raise GpumemInputError(
                f"expert parallel degree {run.ep} does not divide the {spec.moe.num_experts} experts",
                field="ep",
            )
        if run.ep > run.gpus:
            raise GpumemInputError(
                f"expert parallel degree {run.ep} exceeds the {run.gpus} GPUs (tp x pp)", field="ep"
            )
    if run.tokens > spec.max_position_embeddings:
        warnings.append(
            f"seq: {run.tokens} tokens exceed the model's max_position_embeddings "
            f"({spec.max_position_embeddings}); fine only with rope scaling"
        )
    if run.engine == "transformers" and run.attn == "flash" and run.compute_dtype == "fp32":
        raise GpumemInputError("flash attention needs fp16 or bf16 activations", field="attn")
    return tuple(warnings)


# ---- the transformers profile -----------------------------------------------------------------------------


_KIND_LABELS = {
    "kv_cache": "KV cache",
    "hidden_states": "hidden states",
    "attention": "attention temporaries",
    "mlp": "MLP temporaries",
    "norm": "norm temporaries",
    "logits": "logits",
    "rope": "rotary tables",
    "mask": "attention mask",
    "inputs": "input ids",
}


@lru_cache(maxsize=4096)
def _kind_explanation(kind: str, where: str, dt_label: str) -> Explanation:
    """How the bytes of one kind at the peak were found; one shared (immutable) instance per kind, place and
    dtype, as every estimate with its peak there explains them the same way."""
    return Explanation(
        formula=f"{_KIND_LABELS[kind]} live at the peak ({where}), from an op-by-op replay of the "
        "transformers forward",
        inputs={"where": where, "dtype": dt_label},
        source="transformers 5.x modeling code; checked against PyTorch MemTracker measurements",
    )


def _kind_components(sim: ForwardResult, dt_label: str) -> list[Component]:
    out = []
    for kind in KINDS:
        n = sim.by_kind.get(kind, 0)
        if not n:
            continue
        key = kind if kind in ("kv_cache", "logits") else f"act_{kind}"
        out.append(
            Component(
                key=key,
                label=_KIND_LABELS[kind],
                bytes=n,
                explain=_kind_explanation(kind, sim.where, dt_label),
            )
        )
    return out


def weights_from_files(spec: ModelSpec, inv: WeightsInventory) -> WeightBytes:
    """The exact bytes of the model's own files (safetensors/GGUF headers), in the shape formulas give."""
    by = dict.fromkeys(COMPONENTS, 0)
    per_layer = [0] * spec.num_layers
    for t in inv.tensors:
        by[t.component if t.component in by else "embedding_extra"] += t.nbytes
        if t.layer is not None and t.layer < spec.num_layers:
            per_layer[t.layer] += t.nbytes
    params = count_params(spec).total
    return WeightBytes(
        format="file",
        total_bytes=inv.total_bytes,
        params=params,
        quantized_params=0,
        quantized_bytes=0,
        by_component=by,
        per_layer=tuple(per_layer),
        by_storage=dict(inv.bytes_by_dtype),
        bits_per_param=inv.total_bytes * 8 / params if params else 0.0,
        explain=Explanation(
            formula="sum of every tensor's bytes in the file headers (the files win over any formula)",
            inputs={"files": len(inv.files), "tensors": inv.tensor_count, "quantization": inv.quantization},
            source=f"{inv.format} headers of {inv.source}",
        ),
    )


def run_weight_bytes(
    spec: ModelSpec, run: InferenceRun, file_weights: WeightsInventory | None = None
) -> WeightBytes:
    """Weight bytes of the run: the files' exact bytes for ``weights='file'``, else the format's formula.

    transformers with bitsandbytes leaves fused 3-D expert tensors unquantized (they are not ``nn.Linear``;
    bitsandbytes issue #1849), so MoE experts stay 16-bit there.
    """
    if run.weights == "file":
        if file_weights is None:
            raise GpumemInputError(
                "'file' needs a model opened from .safetensors or .gguf files", field="weights"
            )
        return weights_from_files(spec, file_weights)
    return weight_bytes(
        spec, run.weights, compute_dtype_bytes=run.dt, quantize_experts=_quantize_experts(run)
    )


def _quantize_experts(run: InferenceRun) -> bool:
    """Whether the run's format quantizes routed experts (not transformers with bitsandbytes)."""
    return not (run.engine == "transformers" and get_weight_format(run.weights).family == "bitsandbytes")


def estimate_inference(
    spec: ModelSpec,
    run: InferenceRun,
    capacity: int | None = None,
    file_weights: WeightsInventory | None = None,
) -> Estimate:
    """The inference estimate of ``spec`` under ``run`` (see module docstring).

    ``capacity`` (bytes of one GPU) matters only to vLLM, which sizes its KV pool from it; ``file_weights``
    (a model's header inventory) is used when ``run.weights == 'file'``.
    """
    warnings = check_run(spec, run)
    wb = run_weight_bytes(spec, run, file_weights)
    if run.engine != "transformers":
        from gpumem_gui.core.runtimes.engines import estimate_engine

        return estimate_engine(spec, run, warnings, capacity, wb)
    return _estimate_transformers(spec, run, warnings, wb)


def _load_phase(
    spec: ModelSpec, run: InferenceRun, degrees: Degrees, stage: int, wb: WeightBytes
) -> tuple[Component, Phase]:
    """The weights component of one rank of ``stage`` and the load phase that holds only it."""
    if run.weights == "file":  # the files' own bytes (the inventory is no cache key)
        return _build_load_phase(spec, run.weights, degrees, stage, wb)
    return _format_load_phase(spec, run.weights, run.dt, _quantize_experts(run), degrees, stage)


@lru_cache(maxsize=1024)
def _format_load_phase(
    spec: ModelSpec, weights: str, dt: int, quantize_experts: bool, degrees: Degrees, stage: int
) -> tuple[Component, Phase]:
    """:func:`_load_phase` of a weight format: it depends only on the spec, the format and the split, so
    every estimate of them shares one (immutable) result."""
    wb = weight_bytes(spec, weights, compute_dtype_bytes=dt, quantize_experts=quantize_experts)
    return _build_load_phase(spec, weights, degrees, stage, wb)


def _build_load_phase(
    spec: ModelSpec, weights: str, degrees: Degrees, stage: int, wb: WeightBytes
) -> tuple[Component, Phase]:
    comp = _weights_component(spec, weights, degrees, stage, wb)
    return comp, Phase(name="load", peak_bytes=comp.bytes, components=(comp,))


def _weights_component(spec: ModelSpec, weights: str, run: Degrees, stage: int, wb: WeightBytes) -> Component:
    layers = stage_layers(spec, run.pp, stage)
    layer_bytes = sum(wb.per_layer[i] for i in layers)
    outside = wb.total_bytes - sum(wb.per_layer)  # embeddings, final norm, lm_head, vision
    # embeddings (and vision) on the first stage, final norm + lm_head on the last; tied heads share the table
    first, last = stage == 0, stage == run.pp - 1
    emb = (
        wb.by_component.get("embedding", 0)
        + wb.by_component.get("position_embedding", 0)
        + wb.by_component.get("embedding_extra", 0)
        + wb.by_component.get("vision", 0)
    )
    head = outside - emb
    stage_outside = (emb if first else 0) + (head if last else 0)
    if spec.tie_word_embeddings and last and not first:
        stage_outside += wb.by_component.get("embedding", 0)  # the last stage needs its own copy of the table
    sharded = layer_bytes + stage_outside
    per_rank = _tp_share(spec, run, wb, layers, sharded)
    return Component(
        key="weights",
        label=f"weights ({weights})",
        bytes=per_rank + (buffers_bytes(spec) if first else 0),
        explain=Explanation(
            formula=wb.explain.formula
            + (f"; split over tp={run.tp} x pp={run.pp}" if run.tp * run.pp > 1 else "")
            + "; + rotary buffers",
            inputs={
                **wb.explain.inputs,
                "tp": run.tp,
                "pp": run.pp,
                "ep": run.ep,
                "stage_layers": len(layers),
            },
            source=wb.explain.source,
        ),
    )


def _tp_share(spec: ModelSpec, run: Degrees, wb: object, layers: range, stage_bytes: int) -> int:
    """Bytes of one TP/EP rank: linears and embeddings divided, norms replicated, experts over ep x tp."""
    if run.tp == 1 and run.ep == 1:
        return stage_bytes
    by = wb.by_component  # type: ignore[attr-defined]
    total = wb.total_bytes  # type: ignore[attr-defined]
    frac = stage_bytes / total if total else 0
    norms = by.get("norms", 0) * frac
    experts = by.get("routed_experts", 0) * frac
    rest = stage_bytes - norms - experts
    expert_ranks = run.ep * (run.tp if run.ep == 1 else 1)
    return round(rest / run.tp + norms + experts / expert_ranks)


def _estimate_transformers(
    spec: ModelSpec, run: InferenceRun, warnings: tuple[str, ...], wb: WeightBytes
) -> Estimate:
    kvb = kv_bytes_per_element(run.kv_dtype_resolved)
    shares: list[tuple[GpuShare, dict[str, Phase]]] = []
    kv_logical_total = 0
    degrees = Degrees(tp=run.tp, pp=run.pp, ep=run.ep)
    for stage in range(run.pp):
        rspec = rank_spec(spec, degrees, stage)
        weights, load = _load_phase(spec, run, degrees, stage, wb)
        last_stage = stage == run.pp - 1
        phases: dict[str, Phase] = {"load": load}
        fwd = ReplayConfig(
            batch=run.batch,
            q=run.seq,
            param_dt=_REPLAY_DTYPES[run.compute_dtype],
            attn=run.attn,
            logits_to_keep=0 if run.logits == "all" else 1,
            kv_bytes=kvb,
            lm_head=last_stage,
            weights_counted=False,
        )
        pre = replay_forward(rspec, fwd)
        kv_logical_total = max(kv_logical_total, pre.kv_cache_logical)
        comps = (weights, *_kind_components(pre, run.compute_dtype))
        phases["prefill"] = Phase(
            name="prefill", peak_bytes=weights.bytes + pre.peak, components=comps, note=f"peak at {pre.where}"
        )
        if run.new_tokens > 0:
            past = run.tokens - 1
            dec = replay_forward(
                rspec,
                ReplayConfig(
                    batch=run.batch,
                    q=1,
                    past=past,
                    param_dt=fwd.param_dt,
                    attn=run.attn,
                    logits_to_keep=1,
                    kv_bytes=kvb,
                    lm_head=last_stage,
                    weights_counted=False,
                ),
            )
            extra = []
            if last_stage:
                # generate(): next_token_logits = logits[:, -1].to(copy=True, dtype=float32), then the
                # processed scores (transformers generation/utils.py, _sample)
                gen = 2 * run.batch * rspec.vocab_size * 4
                extra.append(
                    Component(
                        key="generate_logits",
                        label="generate() fp32 scores",
                        bytes=gen,
                        explain=Explanation(
                            formula="2 x batch x vocab x 4 B: fp32 copy of the last logits, processed scores",
                            inputs={"batch": run.batch, "vocab": rspec.vocab_size},
                            source="transformers generation/utils.py _sample()",
                        ),
                    )
                )
            dcomps = (weights, *_kind_components(dec, run.compute_dtype), *extra)
            phases["decode"] = Phase(
                name="decode",
                peak_bytes=weights.bytes + dec.peak + sum(c.bytes for c in extra),
                components=dcomps,
                note=f"last step: 1 token after {past} cached; peak at {dec.where}",
            )
            kv_logical_total = max(kv_logical_total, dec.kv_cache_logical)
        peak_phase = max(phases.values(), key=lambda p: p.peak_bytes)
        shares.append((stage_share(stage, run.tp, peak_phase, weights.bytes, run.cuda_context_mib), phases))
    worst_share, worst_phases = max(shares, key=lambda s: s[0].total_bytes)
    peak_phase = max(worst_phases.values(), key=lambda p: p.peak_bytes)
    per_gpu = tp_ranks((s for s, _ in shares), run.tp)
    return Estimate(
        mode="inference",
        engine="transformers",
        phases=worst_phases,
        peak_phase=peak_phase.name,
        peak_bytes=worst_share.peak_bytes,
        total_bytes=worst_share.total_bytes,
        components=worst_share.components,
        per_gpu=per_gpu,
        kv_cache_bytes=kv_logical_total,
        warnings=warnings,
        facts={"params_total": count_params(spec).total, "gpus": run.gpus},
    )
