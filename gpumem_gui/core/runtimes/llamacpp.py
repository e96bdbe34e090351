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

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, check_kv_dtype, kv_bytes_per_element
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.results.nontorch import context_bytes
from gpumem_gui.core.runtimes import llamacpp_dsv4, refusals
from gpumem_gui.core.runtimes.base import Lever, Runtime, component
from gpumem_gui.core.runtimes.llamacpp_compute import OP_OFFLOAD_MIN_BATCH, compute_buffer
from gpumem_gui.core.runtimes.ollama_models import gguf_weights_id
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.state_pools import llamacpp_state_buffers
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import has_state

# llama-server's -ctk/-ctv spell the float types f16/f32 (common/arg.cpp kv_cache_types)
_KV_FLAGS = {"fp16": "f16", "fp32": "f32", "bf16": "bf16"}


def hf_gguf_weights(tag: str) -> str | None:
    """The weight format a ``-hf <repo>:<tag>`` GGUF type names (None: not a type gpumem knows)."""
    try:
        return gguf_weights_id(tag)
    except GpumemInputError:
        return None


_FLOAT_KV = ("fp16", "f16", "fp32", "f32", "bf16")
# layers without KV cells in llama_memory_hybrid (filter_attn = !is_recurrent(il), and Nemotron-H's MLP-only
# layers, n_ff(il) != 0); cross-attention layers keep their cells as before


def output_on_gpu(spec: ModelSpec, run: InferenceRun) -> bool:
    """llama.cpp offloads the output layer (and norm) only when every repeating layer is offloaded
    (``-ngl`` above n_layer; src/llama-model.cpp load_tensors: dev_output)."""
    return run.n_gpu_layers < 0 or run.n_gpu_layers > spec.num_layers


def _head_bytes(spec: ModelSpec, wb: WeightBytes) -> int:
    """The output norm and output layer; a tied output layer is its own copy of token_embd
    (src/llama-model.cpp: output = create_tensor(tok_embd's name, TENSOR_DUPLICATED) on the output's
    device)."""
    embeddings = sum(
        wb.by_component.get(k, 0) for k in ("embedding", "position_embedding", "embedding_extra", "vision")
    )
    head = wb.total_bytes - sum(wb.per_layer) - embeddings
    return head + (wb.by_component.get("embedding", 0) if spec.tie_word_embeddings else 0)


def _offload(spec: ModelSpec, run: InferenceRun, wb: WeightBytes) -> tuple[int, int, int]:
    """(offloaded layers, model bytes on the GPU, model bytes in host memory): llama.cpp offloads the last
    layers first and the output layer (and norm) only when every layer is offloaded."""
    n_layers = spec.num_layers
    ngl = run.n_gpu_layers
    offloaded = n_layers if ngl < 0 or ngl > n_layers else ngl
    on_gpu = output_on_gpu(spec, run)
    model_gpu = sum(wb.per_layer[n_layers - offloaded :]) + (_head_bytes(spec, wb) if on_gpu else 0)
    # a tied output layer on the GPU is a copy: token_embd itself stays in host memory (published Ollama log
    # of llama3.2:3b: CPU model buffer 308.23 MiB = token_embd, CHANGELOG.md, 0.1.0-dev.3); with the output
    # layer in host memory too, the duplicate maps the same file range (CPU_Mapped counts it once)
    copy = wb.by_component.get("embedding", 0) if spec.tie_word_embeddings and on_gpu else 0
    return offloaded, model_gpu, wb.total_bytes - model_gpu + copy


# llama.cpp's own KV cache type when -ctk/-ctv are not given, whatever the model's dtype (common/common.h
# common_params cache_type_k / cache_type_v = GGML_TYPE_F16; llama_context_default_params type_k / type_v)
LLAMA_DEFAULT_KV = "fp16"


def kv_types(run: InferenceRun) -> tuple[str, str]:
    """(K type, V type): ``-ctk``/``-ctv`` when given, else the run's KV cache type for both (``auto``:
    llama.cpp's default, f16)."""
    kv = LLAMA_DEFAULT_KV if run.kv_dtype == "auto" else run.kv_dtype
    return run.cache_type_k or kv, run.cache_type_v or kv


def kv_label(k_type: str, v_type: str) -> str:
    """The K and V cache types in llama.cpp's spelling: ``f16``, or ``K q8_0, V f16`` when they differ."""
    k, v = (_KV_FLAGS.get(t, t) for t in (k_type, v_type))
    return k if k == v else f"K {k}, V {v}"


def kv_row_widths(spec: ModelSpec, run: InferenceRun) -> tuple[int, int]:
    """(K, V) elements one token stores per layer: GQA heads x head size; MLA models store the latent
    (K = kv_lora_rank + rope, V = kv_lora_rank, published log) or, with an older GGUF conversion, full
    per-head K (nope + rope) and V (``n_embd_k_gqa = 24576, n_embd_v_gqa = 16384`` for DeepSeek-R1)."""
    latent = model_kinds(spec).latent
    if latent is None:
        w = spec.num_kv_heads * spec.head_dim
        return w, w
    return latent.llamacpp_elems(full=run.mla_cache == "full")


def kv_caches(spec: ModelSpec, run: InferenceRun, chunked: bool = True) -> list[tuple[tuple[int, ...], int]]:
    """(layers, cells) of each attention kind: ``n_ctx`` cells for full attention; llama_kv_cache_iswa gives
    an SWA layer min(n_ctx, pad(n_swa x n_seq + n_ubatch, 256)) cells, Llama 4's chunked layers too
    (LLAMA_SWA_TYPE_CHUNKED, n_swa 8192 = its attention_chunk_size: load_hparams), and with ``--swa-full``
    n_ctx (src/llama-kv-cache-iswa.cpp: size_swa = size_base). llama_memory_hybrid gives KV cells to the
    attention layers only, and a layer reading another's cache has none (llama_hparams::has_kv: Gemma 3n's
    n_layer_kv_from_start). ``chunked`` False: chunked layers keep every token (Ollama v0.12.10's own engine,
    ``kvcache.NewChunkedAttentionCache``: the chunk only masks)."""
    n_ctx = run.batch * run.tokens
    bounds = model_kinds(spec).bounds(chunked)
    out = []
    for kind in model_kinds(spec).attention:
        b = bounds[kind.layers[0]]
        swa = b is not None and not run.swa_full
        cells = min(n_ctx, ceil((b[1] * run.batch + run.n_ubatch) / 256) * 256) if swa and b else n_ctx
        out.append((tuple(kind.layers), cells))
    return out


def kv_buffers(spec: ModelSpec, run: InferenceRun, offloaded: int, chunked: bool = True) -> tuple[int, int]:
    """(GPU bytes, host bytes) of the KV cache (the cells of :func:`kv_caches`); each layer's KV lives
    where the layer runs (the last ``offloaded`` layers on the GPU), or all of it in host memory with
    ``--no-kv-offload`` (``kv_offload`` off) (src/llama-kv-cache.cpp, offload_kqv)."""
    k_type, v_type = kv_types(run)
    if spec.deepseek_v4 is not None:  # DeepSeek-V4: llama_kv_cache_dsv4 (llamacpp_dsv4.py)
        return llamacpp_dsv4.kv_buffers(spec, run, offloaded, k_type)
    k_w, v_w = kv_row_widths(spec, run)
    row = k_w * kv_bytes_per_element(k_type) + v_w * kv_bytes_per_element(v_type)
    first_gpu = spec.num_layers - offloaded
    gpu = host = 0
    for layers, cells in kv_caches(spec, run, chunked):
        size = round(cells * row)
        for i in layers:
            if i >= first_gpu and run.kv_offload:
                gpu += size
            else:
                host += size
    return gpu, host


def _kv_buffer(spec: ModelSpec, run: InferenceRun, offloaded: int) -> int:
    """The KV bytes on the GPU (see :func:`kv_buffers`)."""
    return kv_buffers(spec, run, offloaded)[0]


def _compute_buffer(
    spec: ModelSpec,
    run: InferenceRun,
    output: bool = True,
    wb: WeightBytes | None = None,
    chunked: bool = True,
) -> Component:
    """The GPU's compute buffer (:func:`.llamacpp_compute.compute_buffer`), one KQ mask per KV cache (the
    full-attention one and llama_kv_cache_iswa's SWA one). ``output`` False: a GPU of a layer split that
    does not hold the output layer (no logits stage). ``wb`` given: a single GPU under ``-ngl``, where the
    output layer and the layers left in host memory are copied in for a micro-batch of at least
    OP_OFFLOAD_MIN_BATCH tokens (ggml_backend_sched op offload)."""
    cells = kv_caches(spec, run, chunked)
    full = [c for layers, c in cells if model_kinds(spec).bounds(chunked)[layers[0]] is None]
    swa = [c for layers, c in cells if model_kinds(spec).bounds(chunked)[layers[0]] is not None]
    caches = tuple(max(group) for group in (full, swa) if group)
    if wb is None or output_on_gpu(spec, run):
        return compute_buffer(spec, run, caches, output=output)
    offload = min(run.n_ubatch, run.batch * run.tokens) >= OP_OFFLOAD_MIN_BATCH
    host_layers = wb.per_layer[: spec.num_layers - max(run.n_gpu_layers, 0)]
    return compute_buffer(
        spec,
        run,
        caches,
        output=offload,
        output_weight=_head_bytes(spec, wb) if offload else 0,
        host_layer=max(host_layers, default=0) if offload else 0,
    )


def _state_component(rs: dict[str, int]) -> Component:
    """llama_memory_recurrent's RS buffer on the GPU (the recurrent layers offloaded, with KV offload)."""
    return component(
        "recurrent_state",
        "recurrent state (RS buffer)",
        rs["gpu_bytes"],
        "max(1, n_seq_max) cells x (n_embd_r + n_embd_s) x 4 B (f32) per recurrent layer on the GPU",
        "llama.cpp src/llama-memory-recurrent.cpp (r_l, s_l); llama-hparams.cpp n_embd_r / n_embd_s; "
        "llama-model.cpp create_memory (llama_memory_hybrid, recurrent types F32)",
        cells=rs["cells"],
        r_bytes=rs["r_bytes"],
        s_bytes=rs["s_bytes"],
        host_bytes=rs["host_bytes"],
    )


def _state_facts(rs: dict[str, int]) -> dict[str, int]:
    """The RS buffer as llama.cpp logs it (R and S over all recurrent layers) and its host part."""
    out = {"rs_cells": rs["cells"], "rs_r_bytes": rs["r_bytes"], "rs_s_bytes": rs["s_bytes"]}
    return out | ({"rs_host_bytes": rs["host_bytes"]} if rs["host_bytes"] else {})


class LlamaCpp(Runtime):
    name = "llama.cpp"
    compressed_attention = True  # DeepSeek-V4: llama_kv_cache_dsv4 (runtimes/llamacpp_dsv4.py)
    label = "llama.cpp"
    # llama_memory_recurrent's r / s widths (runtimes/state_pools.py llamacpp_state_widths)
    state_mixers = frozenset({"gated_deltanet", "kda", "lightning", "mamba1", "mamba2", "short_conv"})
    cross_attention_refusal = refusals.LLAMACPP_CROSS_ATTENTION  # no mllama in llama-arch.cpp
    gguf = True
    fallback_format = "gguf-Q4_K_M"
    # chunked-local layers keep one chunk (+ a micro-batch) of cells, as SWA layers (LLAMA_SWA_TYPE_CHUNKED)
    chunked_local = True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """-ctk/-ctv must be types llama.cpp takes (an error); a quantized V cache without flash attention is
        refused by llama.cpp at start (src/llama-context.cpp, "V cache quantization requires flash_attn"): a
        warning, the buffers are still estimated."""
        v_type = kv_types(run)[1]
        for field, value in (("cache_type_k", run.cache_type_k), ("cache_type_v", run.cache_type_v)):
            if value is not None:
                try:
                    check_kv_dtype(self.name, value)
                except GpumemInputError as e:
                    raise GpumemInputError(
                        str(e).replace("the KV cache", f"the {field[-1].upper()} cache"), field=field
                    ) from None
        warnings = llamacpp_dsv4.check(spec)  # DeepSeek-V4: what is not measured
        if v_type not in _FLOAT_KV and not run.flash_attn:
            warnings.append(
                f"cache_type_v: llama.cpp refuses a quantized V cache ({v_type}) without flash attention "
                "(V cache quantization requires flash_attn); turn -fa on"
            )
        if run.mla_cache == "full" and model_kinds(spec).latent is None:
            warnings.append("mla_cache: the model has no MLA layers; 'full' changes nothing")
        if any(k.mixer in ("kda", "lightning") for k in model_kinds(spec).state):
            # llama-context.cpp reserves these graphs at one sequence: [TAG_RESERVE_DIAG_DECAY]
            warnings.append(
                "llama.cpp: the KDA / lightning graph's own inputs in the compute buffer (decay tensors "
                "growing with n_ubatch^2) are not modelled; the RS and KV buffers are"
            )
        return warnings

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        offloaded, model_gpu, model_cpu = _offload(spec, run, wb)
        kv_gpu, kv_host = kv_buffers(spec, run, offloaded, self.chunked_local)
        k_type, v_type = kv_types(run)
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
            "n_ctx cells x (K width x K type size + V width x V type size) per layer on the GPU "
            "(offloaded layers, none with --no-kv-offload)",
            "llama.cpp src/llama-kv-cache.cpp",
            n_ctx=run.batch * run.tokens,
            type_k=k_type,
            type_v=v_type,
            host_bytes=kv_host,
        )
        compute_c = _compute_buffer(spec, run, wb=wb, chunked=self.chunked_local)
        rs = llamacpp_state_buffers(spec, run.batch, spec.num_layers - offloaded, run.kv_offload)
        state_c = _state_component(rs) if has_state(spec) else None
        ctx = component(
            "cuda_context",
            "CUDA context",
            context_bytes(run.gpu_arch, run.cuda_context_mib),
            "fixed per process",
            "by GPU generation (gpu_arch) or --cuda-context-mib: see gpumem_gui/core/results/nontorch.py",
        )
        caches = (kv_c,) if state_c is None else (kv_c, state_c)
        comps = (weights_c, *caches, compute_c, ctx)
        peak = model_gpu + kv_gpu + rs["gpu_bytes"] + compute_c.bytes
        total = peak + ctx.bytes
        phases = {
            "load": Phase(name="load", peak_bytes=peak - compute_c.bytes, components=(weights_c, *caches)),
            "decode": Phase(name="decode", peak_bytes=peak, components=(weights_c, *caches, compute_c)),
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
                # the KV of layers left on the CPU (or all of it with --no-kv-offload), when there is any
                **({"kv_host_bytes": kv_host} if kv_host else {}),
                **(_state_facts(rs) if state_c is not None else {}),
            },
        )

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """Leave layers in host memory: the most layers on the GPU that still fit (``-ngl``)."""
        n = spec.num_layers
        best = largest(lambda k: fits(n_gpu_layers=k), 0, n)
        if best is None or best >= n:
            return []
        return [(6, "offload", f"offload {n - best} layers to the CPU (-ngl {best})", {"n_gpu_layers": best})]

    def kv_cache_dtype(self, spec: ModelSpec, run: InferenceRun) -> str:
        """-ctk / -ctv as given, else llama.cpp's f16 (not the compute dtype)."""
        return kv_label(*kv_types(run))

    # the run fields llama-server has no option for (Runtime.unexpressed): -c holds each slot's prompt + new
    # tokens together; the GGUF file's MLA layout; a split over GPUs is llama.cpp's own (-sm, -ts)
    unexpressed = (
        ("seq", "each slot's context (-c / -np) is prompt + new tokens"),
        ("new_tokens", "each slot's context (-c / -np) is prompt + new tokens"),
        ("tp", "llama.cpp splits the layers over the visible GPUs itself"),
        ("pp", "llama.cpp splits the layers over the visible GPUs itself"),
        ("ep", "llama.cpp has no expert parallelism"),
        ("mla_cache", "the GGUF conversion's MLA layout"),
        ("compute_dtype", "llama.cpp has no compute dtype option (its kernels choose)"),
        ("cuda_context_mib", "the driver's CUDA context"),
        ("gpu_arch", "the GPU the driver runs on"),
    )

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        """A GGUF file (weights = file), or a GGUF type of a Hugging Face GGUF repository (``-hf
        <repo>:<type>``, common/arg.cpp: llama.cpp downloads that file)."""
        why = super().expresses(spec, run, source, checkpoint)
        if why is not None or run.weights == "file":
            return why
        if source.lower().endswith(".gguf"):
            return f"{source} holds its own GGUF types: llama.cpp loads it as it is (weights = file)"
        if "gguf" not in source.lower() or source.startswith(("/", "./", "../", "~")) or "\\" in source:
            return (
                f"llama.cpp loads a GGUF file; {source} is not a Hugging Face GGUF repository (-hf "
                "<repo>:<type>): convert it with convert_hf_to_gguf.py and open the file"
            )
        if hf_gguf_weights(run.weights.removeprefix("gguf-")) != run.weights:
            return f"-hf <repo>:<type> names a GGUF type; {run.weights} is a llama-quantize mix, not a type"
        return None

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        k_type, v_type = (_KV_FLAGS.get(t, t) for t in kv_types(run))
        file = run.weights == "file" or model.lower().endswith(".gguf")  # else a GGUF repository's type
        where = ["-m", model] if file else ["-hf", f"{model}:{run.weights.removeprefix('gguf-')}"]
        args = [
            "llama-server",
            *where,
            "-c",
            str(run.batch * run.tokens),
            "-ngl",  # common/arg.cpp -ngl: an exact number, 'auto' or 'all'
            "all" if run.n_gpu_layers < 0 else str(run.n_gpu_layers),
            "-ctk",
            k_type,
            "-ctv",
            v_type,
            "-b",
            str(run.n_batch),
            "-ub",
            str(run.n_ubatch),
            "-fa",
            "on" if run.flash_attn else "off",
        ]
        if run.batch > 1:
            args += ["-np", str(run.batch)]
        if not run.kv_offload:
            args.append("-nkvo")
        if run.swa_full:
            args.append("--swa-full")
        return self.with_unsaid(run, [shlex.join(args)])


LLAMA_CPP = LlamaCpp()
