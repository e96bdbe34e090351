"""llama.cpp's KV cache: the K / V types, a token's row widths, the cells of each attention kind and the
buffers on the GPU and in host memory (``src/llama-kv-cache.cpp``, ``src/llama-kv-cache-iswa.cpp``)."""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.formats import kv_bytes_per_element
from gpumem_gui.core.runtimes import llamacpp_dsv4
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

# llama-server's -ctk/-ctv spell the float types f16/f32 (common/arg.cpp kv_cache_types)
KV_FLAGS = {"fp16": "f16", "fp32": "f32", "bf16": "bf16"}


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
    k, v = (KV_FLAGS.get(t, t) for t in (k_type, v_type))
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
    if model_kinds(spec).compressed is not None:  # DeepSeek-V4: llama_kv_cache_dsv4 (llamacpp_dsv4.py)
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
