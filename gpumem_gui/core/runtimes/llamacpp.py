"""The llama.cpp runtime: a model buffer, a KV buffer and a compute buffer per GPU, from GGUF files.

``src/llama-model.cpp`` ``load_tensors``: the offloaded layers (``-ngl``; the token embedding stays in host
memory, the output layer is offloaded with the last layer) form the model buffer; ``src/llama-kv-cache.cpp``
gives ``n_ctx`` cells to every offloaded layer; the compute buffer is sized by ``ggml-alloc`` for one
``n_ubatch`` micro-batch.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from math import ceil

from gpumem_gui.core.formats import WeightBytes, kv_bytes_per_element
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.runtimes.base import Lever, Runtime, component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.units import MiB

# llama-server's -ctk/-ctv spell the float types f16/f32 (common/arg.cpp kv_cache_types)
_KV_FLAGS = {"fp16": "f16", "fp32": "f32", "bf16": "bf16"}


def _offload(spec: ModelSpec, run: InferenceRun, wb: WeightBytes) -> tuple[int, int, int]:
    """(offloaded layers, model bytes on the GPU, model bytes in host memory): llama.cpp offloads the last
    layers first and the output layer (and norm) only when every layer is offloaded."""
    n_layers = spec.num_layers
    ngl = run.n_gpu_layers
    offloaded = n_layers if ngl < 0 or ngl > n_layers else ngl
    output_on_gpu = ngl < 0 or ngl > n_layers
    layers_gpu = sum(wb.per_layer[n_layers - offloaded :])
    embeddings = sum(
        wb.by_component.get(k, 0) for k in ("embedding", "position_embedding", "embedding_extra", "vision")
    )
    head = wb.total_bytes - sum(wb.per_layer) - embeddings  # output norm + output layer
    if spec.tie_word_embeddings:
        head += wb.by_component.get("embedding", 0)  # the output layer reuses token_embd, copied to the GPU
    model_gpu = layers_gpu + (head if output_on_gpu else 0)
    return offloaded, model_gpu, wb.total_bytes - model_gpu


def _kv_buffer(spec: ModelSpec, run: InferenceRun, offloaded: int) -> int:
    """KV cells of every offloaded layer: ``n_ctx`` for full attention, fewer for sliding-window layers."""
    kv_elem = kv_bytes_per_element(run.kv_dtype_resolved)
    n_ctx = run.batch * run.tokens
    if spec.mla is not None:
        # llama.cpp caches the MLA latent: K = kv_lora_rank + rope, V = kv_lora_rank (published log)
        width = 2 * spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    else:
        width = 2 * spec.num_kv_heads * spec.head_dim
    swa_layers = spec.resolved_layer_types[spec.num_layers - offloaded :].count("sliding_attention")
    swa_cells = n_ctx
    if swa_layers and spec.sliding_window:
        # llama_kv_cache_iswa: SWA layers keep min(n_ctx, pad(n_swa * n_seq + n_ubatch, 256)) cells
        swa_cells = min(n_ctx, ceil((spec.sliding_window * run.batch + run.n_ubatch) / 256) * 256)
    return (offloaded - swa_layers) * round(n_ctx * width * kv_elem) + swa_layers * round(
        swa_cells * width * kv_elem
    )


def _compute_buffer(spec: ModelSpec, run: InferenceRun) -> Component:
    """ggml's graph allocator reuses memory between the stages of one micro-batch, so the buffer is the
    largest stage, not the sum (``ggml/src/ggml-alloc.c``): f32 tensors of ``n_ubatch`` rows each."""
    n_ctx = run.batch * run.tokens
    ub = min(run.n_ubatch, n_ctx)
    h = spec.hidden_size
    f = spec.moe.expert_intermediate_size * spec.moe.experts_per_token if spec.moe else spec.intermediate_size
    row = ub * h * 4  # one hidden-state tensor
    stages = {
        # logits of the micro-batch and the normed hidden state feeding them
        "output": ub * spec.vocab_size * 4 + row,
        # gate and up projections (x experts used per token) and their product
        "ffn": 2 * ub * f * 4 + 2 * row,
        # without flash attention the KQ matrix [n_kv, n_ubatch, n_head] is materialised in f32; with it,
        # only per-head tiles; plus q/k/v/out rows
        "attention": (0 if run.flash_attn else ub * n_ctx * spec.num_attention_heads * 4) + 4 * row,
    }
    stage = max(stages, key=lambda k: stages[k])
    return component(
        "compute_buffer",
        "compute buffer",
        stages[stage],
        "largest graph stage of one micro-batch, f32: output (n_ubatch x vocab + row), FFN "
        "(2 x n_ubatch x F_used + 2 rows) or attention (n_ubatch x n_ctx x heads without flash attention "
        "+ 4 rows); row = n_ubatch x hidden x 4 B",
        "ggml/src/ggml-alloc.c (buffers reused between stages); checked against published llama.cpp logs "
        "(docs/validation.md)",
        n_ubatch=ub,
        flash_attn=run.flash_attn,
        stage=stage,
    )


class LlamaCpp(Runtime):
    name = "llama.cpp"
    label = "llama.cpp"
    gguf = True
    fallback_format = "gguf-Q4_K_M"

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        capacity: int | None,
        wb: WeightBytes,
    ) -> Estimate:
        offloaded, model_gpu, model_cpu = _offload(spec, run, wb)
        kv_gpu = _kv_buffer(spec, run, offloaded)
        weights_c = component(
            "weights",
            f"model buffer ({run.weights}, {offloaded}/{spec.num_layers} layers on GPU)",
            model_gpu,
            "offloaded layers' tensors + output layer when all layers are offloaded",
            "llama.cpp src/llama-model.cpp load_tensors (token_embd stays in host memory)",
            offloaded=offloaded,
            n_layers=spec.num_layers,
        )
        kv_c = component(
            "kv_cache",
            "KV buffer",
            kv_gpu,
            "n_ctx cells x (K + V width) x type size per offloaded layer",
            "llama.cpp src/llama-kv-cache.cpp",
            n_ctx=run.batch * run.tokens,
            kv_type=run.kv_dtype_resolved,
        )
        compute_c = _compute_buffer(spec, run)
        ctx = component(
            "cuda_context",
            "CUDA context",
            run.cuda_context_mib * MiB,
            "fixed per process",
            "see gpumem_gui/core/results/overheads.py",
        )
        comps = (weights_c, kv_c, compute_c, ctx)
        peak = model_gpu + kv_gpu + compute_c.bytes
        total = peak + ctx.bytes
        phases = {
            "load": Phase(name="load", peak_bytes=model_gpu + kv_gpu, components=(weights_c, kv_c)),
            "decode": Phase(name="decode", peak_bytes=peak, components=(weights_c, kv_c, compute_c)),
        }
        return Estimate(
            mode="inference",
            engine=self.name,
            phases=phases,
            peak_phase="decode",
            peak_bytes=peak,
            total_bytes=total,
            components=comps,
            per_gpu=(GpuShare(index=0, role="GPU 0", peak_bytes=peak, total_bytes=total, components=comps),),
            kv_cache_bytes=kv_gpu,
            warnings=warnings,
            facts={
                "cpu_bytes": model_cpu,
                "offloaded_layers": offloaded,
                "params_total": count_params(spec).total,
            },
        )

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """Leave layers in host memory: the most layers on the GPU that still fit (``-ngl``)."""
        n = spec.num_layers
        best = largest(lambda k: fits(n_gpu_layers=k), 0, n)
        if best is None or best >= n:
            return []
        return [(6, "offload", f"offload {n - best} layers to the CPU (-ngl {best})", {"n_gpu_layers": best})]

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        kv = _KV_FLAGS.get(run.kv_dtype_resolved, run.kv_dtype_resolved)
        args = [
            "llama-server",
            "-m",
            model if model.endswith(".gguf") else f"{model}.gguf",
            "-c",
            str(run.batch * run.tokens),
            "-ngl",
            str(999 if run.n_gpu_layers < 0 else run.n_gpu_layers),
            "-ctk",
            kv,
            "-ctv",
            kv,
            "-b",
            str(run.n_batch),
            "-ub",
            str(run.n_ubatch),
            "-fa",
            "on" if run.flash_attn else "off",
        ]
        if run.batch > 1:
            args += ["-np", str(run.batch)]
        return shlex.join(args)


LLAMA_CPP = LlamaCpp()
