"""Inference memory: ``estimate_inference(spec, run) -> Estimate``, dispatched to the run's engine.

Each engine is one :class:`~gpumem_gui.core.runtimes.base.Runtime` module (:mod:`.transformers`,
:mod:`.vllm`, :mod:`.llamacpp`); this module holds what they share: the cross-checks of a run against a
model, the weight bytes, and the registry. Nothing else branches on the engine's name.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import check_kv_dtype
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.readers.weights import WeightsInventory
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.base import Runtime, run_weight_bytes
from gpumem_gui.core.runtimes.cross_attention import check_cross_attention
from gpumem_gui.core.runtimes.encoder import check_encoder_inference
from gpumem_gui.core.runtimes.llamacpp import LLAMA_CPP
from gpumem_gui.core.runtimes.ollama import OLLAMA
from gpumem_gui.core.runtimes.run import ENGINES, InferenceRun, make_run
from gpumem_gui.core.runtimes.seq2seq import check_seq2seq_inference
from gpumem_gui.core.runtimes.sglang import SGLANG
from gpumem_gui.core.runtimes.state_pools import check_engine_state
from gpumem_gui.core.runtimes.transformers import TRANSFORMERS
from gpumem_gui.core.runtimes.vllm import VLLM
from gpumem_gui.core.spec import gemma4
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, check_degrees
from gpumem_gui.core.spec.state import has_state

__all__ = ["RUNTIMES", "InferenceRun", "check_run", "estimate_inference", "make_run", "runtime"]

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (TRANSFORMERS, VLLM, LLAMA_CPP, OLLAMA, SGLANG)}
assert sorted(RUNTIMES) == sorted(ENGINES), "every engine a run may name has one runtime module"


def runtime(engine: str) -> Runtime:
    """The runtime of an engine name (``InferenceRun.engine``, ``Estimate.engine``)."""
    try:
        return RUNTIMES[engine]
    except KeyError:
        raise GpumemInputError(
            f"unknown engine {engine!r}; engines: {', '.join(RUNTIMES)}", field="engine"
        ) from None


def check_recurrent_state(spec: ModelSpec, engine: str | Runtime, tp: int, pp: int = 1) -> None:
    """Hybrid models (linear-attention layers with a fixed state per sequence) are modelled for transformers
    and for the engines whose state pools are modelled (:mod:`.state_pools`: vLLM's hybrid allocator,
    llama.cpp's recurrent cells, which Ollama v0.12.10's llama runner allocates; :mod:`.sglang_state`:
    SGLang's mamba pool); on one tensor-parallel rank unless the engine shards the state by (attention) TP
    (``Runtime.state_tp``: vLLM, SGLang)."""
    if not has_state(spec):
        return
    rt = engine if isinstance(engine, Runtime) else runtime(engine)
    check_engine_state(spec, rt, pp, RUNTIMES.values())
    if tp > 1 and not rt.state_tp:
        raise GpumemInputError(
            "tensor parallelism of linear-attention layers is not modelled yet; use tp 1", field="tp"
        )


def check_run(spec: ModelSpec, run: InferenceRun) -> tuple[str, ...]:
    """Cross-checks of run against model: errors raise, soft problems come back as warnings."""
    warnings: list[str] = [f"approximate: {spec.approximate}"] if spec.approximate else []
    rt = runtime(run.engine).for_run(run)
    rt.check_layer_kinds(spec)  # DeepSeek-V4's compressed attention: refused by each engine in one line
    model = model_kinds(spec).model
    if model == "encoder":  # one transformers forward, no cache (runtimes/encoder.py)
        check_encoder_inference(spec, run, rt)
    if model == "encoder-decoder":  # generate() of an encoder-decoder on transformers (runtimes/seq2seq.py)
        check_seq2seq_inference(spec, run, rt)
    check_kv_dtype(run.engine, run.kv_dtype)  # one of the engine's own choices, or auto (its default)
    check_degrees(spec, Degrees(tp=run.tp, pp=run.pp, ep=run.ep))
    check_recurrent_state(spec, rt, run.tp, run.pp)
    # Gemma 4: transformers, one GPU
    gemma4.check_run(spec, run.engine, heads_ok=rt.mixed_head_shapes, tp=run.tp, pp=run.pp, ep=run.ep)
    warnings += check_cross_attention(spec, run, rt)  # Llama 3.2 Vision (runtimes/cross_attention.py)
    if run.ep > run.gpus:
        raise GpumemInputError(
            f"expert parallel degree {run.ep} exceeds the {run.gpus} GPUs (tp x pp)", field="ep"
        )
    if spec.num_layers % run.pp and runtime(run.engine).even_stages:
        warnings.append(
            f"pp: {run.pp} stages do not divide {spec.num_layers} layers; the first stages get "
            f"{ceil(spec.num_layers / run.pp)} layers (the estimate uses the fullest stage)"
        )
    if run.tokens > spec.max_position_embeddings and model != "encoder-decoder":  # T5: relative positions
        warnings.append(
            f"seq: {run.tokens} tokens exceed the model's max_position_embeddings "
            f"({spec.max_position_embeddings}); fine only with rope scaling"
        )
    warnings += rt.check(spec, run)
    return tuple(warnings)


def estimate_inference(
    spec: ModelSpec,
    run: InferenceRun,
    capacity: int | GpuMemory | None = None,
    file_weights: WeightsInventory | None = None,
) -> Estimate:
    """The inference estimate of ``spec`` under ``run`` on the run's engine.

    ``capacity`` (one GPU's memory: its nvidia-smi and CUDA totals, or a byte count that is both) matters
    only to engines that size a pool from it (vLLM, SGLang, Ollama);
    ``file_weights`` (a model's header inventory) is used when ``run.weights == 'file'``.
    """
    warnings = check_run(spec, run)
    rt = runtime(run.engine).for_run(run)
    wb = run_weight_bytes(spec, run, rt.quantizes_experts(run), file_weights)
    return rt.estimate(spec, run, warnings, GpuMemory.of(capacity), wb)
