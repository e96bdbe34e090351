"""Ollama's own memory prediction and layer placement (the ``msg=offload ... memory.required.full=...`` line).

Ollama up to v0.12.10 decides how many layers go to the GPU from a prediction, not from llama.cpp's buffers:
``fs/ggml/ggml.go`` ``GraphSize`` (KV bytes per layer and a compute-graph size per architecture, for a full
and a partial offload) and ``llm/memory.go`` ``estimateGPULayers`` (a GPU holds a 457 MiB minimum, one spare
layer, the larger graph and as many layers, last first, as leave it above ``OLLAMA_GPU_OVERHEAD``; then the
output layer). This module writes those rules for one or more GPUs from the model's shapes and the GGUF weight
bytes; the bytes llama.cpp then allocates come from :mod:`.llamacpp`. v0.12.11 (ollama commit f560bd0)
replaced the layout with the Ollama engine's, which measures the graph; v0.30 hands placement to llama-server.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.spec.kinds import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import MiB

# ml/device.go DeviceInfo.MinimumMemory: set aside on a CUDA/ROCm device for context structures
MINIMUM_MEMORY = 457 * MiB
# fs/ggml/ggml.go kvCacheBytesPerElement: Ollama's bytes per K/V element (f16 2; q8_0 1; q4_0 0.5)
OLLAMA_KV_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}
# fs/ggml/ggml.go FlashAttention: architectures whose default is flash attention on (v0.12.10)
FLASH_BY_DEFAULT = ("gemma3", "gptoss", "gpt-oss", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe")
GEMMA3_GLOBAL_EVERY = 6  # ggml.go GraphSize gemma3: every 6th layer is global, the others sliding
GPTOSS_SWA_CELLS = 4096  # ggml.go GraphSize gptoss: Ollama's cells for its sliding layers, per request


@dataclass(frozen=True)
class Prediction:
    """Ollama's figures for one model and context (``GraphSize``)."""

    kv: tuple[int, ...]  # predicted KV bytes of each block
    graph_full: int
    graph_partial: int
    layer_bytes: tuple[int, ...]  # each block's weights
    output_bytes: int  # output_norm + output (token_embd when tied): memoryLayerOutput


@dataclass(frozen=True)
class Placement:
    """``estimateGPULayers`` for one or more GPUs: layers offloaded (output counted), predicted bytes."""

    layers: int  # of blocks + 1
    vram: int  # memory.required.partial: what Ollama expects on the GPUs together
    total: int  # memory.required.full: vram + what did not fit
    graph: int  # the graph Ollama added to each GPU that holds layers (full or partial)
    fully_loaded: bool
    split: tuple[int, ...] = ()  # layers.split: layers (output counted) per GPU, Ollama's --tensor-split
    allocations: tuple[int, ...] = ()  # memory.required.allocations: predicted bytes per GPU


def _kv(spec: ModelSpec, ctx: int, batch: int, parallel: int, elem: float) -> list[int]:
    arch = spec.traits.gguf_arch or ""
    latent = model_kinds(spec).latent  # Ollama's deepseek2 GGUFs: K = nope + rope, V = v_head per head
    width = latent.ollama_width if latent is not None else 2 * spec.head_dim * spec.num_kv_heads
    kv = [int(ctx * width * elem)] * spec.num_layers
    if arch == "gemma3" and spec.sliding_window:
        swa = parallel * spec.sliding_window + batch
        kv = [k if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else int(swa * width * elem) for i, k in enumerate(kv)]
    if arch in ("gpt-oss", "gptoss"):
        swa = parallel * GPTOSS_SWA_CELLS + batch
        kv = [int(width * elem) * (swa if i % 2 == 0 else ctx) for i in range(spec.num_layers)]
    return kv


def _graph(
    spec: ModelSpec, ctx: int, b: int, kv_total: int, flash: bool, parallel: int, wb: WeightBytes
) -> tuple[int, int]:
    """(full, partial) graph bytes of ``GraphSize``'s case for the architecture (integer arithmetic as Go's
    uint64); architectures without a case: partial = heads / kv_heads x KV / 6, full = partial."""
    arch = spec.traits.gguf_arch or ""
    e, heads, hkv, v = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.vocab_size
    eh, ehk = e // heads, spec.head_dim
    full = partial = 0
    if arch == "llama":
        full = max(4 * b * (1 + 4 * e + ctx * (1 + heads)), 4 * b * (e + v))
        partial = 4 * b * e + max(
            4 * b * (1 + e + max(ctx, e)) + e * e * 9 // 16 + 4 * ctx * (b * heads + eh * hkv),
            4 * b * (e + v) + e * v * 105 // 128,
        )
        if spec.moe is not None:  # "mixtral 8x22b": merged expert tensors (ffn_gate_exps)
            gate_exps = wb.by_component.get("routed_experts", 0) // (3 * spec.num_layers)
            ff = spec.intermediate_size
            partial = max(
                3 * gate_exps + 4 * b * (2 * ff + hkv + e + ctx + eh * hkv),
                4 * (ctx * b * heads + ctx * eh * hkv + b * 1024 + eh * hkv * b),
            )
    elif arch in ("gemma", "gemma2", "gemma3"):
        full = max(4 * b * (e + v), 4 * b * (2 + ctx + ctx * heads + 2 * e + 2 * ehk * heads))
        partial = max(
            4 * e * b + e * v * 105 // 128 + 4 * v * b,
            4 * b * (2 * e + 1 + 2 * ehk * heads + ctx + ctx * heads)
            + 4 * ehk * ctx * 8
            + e * ehk * heads * 9 // 16,
        )
    elif arch == "qwen2":
        full = max(4 * b * (e + v), 4 * b * (1 + 2 * e + ctx + ctx * heads))
        partial = max(
            4 * b * (e + v) + e * v * 105 // 128, 4 * (b * (1 + 2 * e + ctx * (1 + heads)) + e * (1 + ctx))
        )
    elif arch == "deepseek2" and spec.mla is not None:
        hk = spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim
        full = max(4 * b * (3 * e + v), 4 * b * (3 * e + 2 + ctx * (1 + hkv) + 2 * hk * hkv))
        partial = max(
            4 * b * (3 * e + v) + e * v * 105 // 128,
            4 * b * (2 * e + 1 + 2 * hk * hkv + ctx + ctx * hkv)
            + 4 * hk * ctx * hkv
            + e * hk * hkv * 9 // 16,
        )
    elif arch in ("gpt-oss", "gptoss"):
        partial = 2 * heads // max(hkv, 1) * kv_total // 6
        if flash:  # Ollama's rough graph with flash attention on
            partial = (4 * parallel + (ctx >> 10) + 110) * MiB
    if partial == 0:
        partial = heads // max(hkv, 1) * kv_total // 6
    if full == 0:
        full = partial
    return full, partial


def predict(
    spec: ModelSpec, wb: WeightBytes, ctx: int, batch: int, parallel: int, kv_type: str, flash: bool
) -> Prediction:
    """``GraphSize(num_ctx, min(num_ctx, num_batch), num_parallel, kv type, flash)``; ``ctx`` is already
    num_ctx x num_parallel (GraphSize multiplies it itself)."""
    kv = _kv(spec, ctx, batch, parallel, OLLAMA_KV_BYTES.get(kv_type, 2.0))
    full, partial = _graph(spec, ctx, batch, sum(kv), flash, parallel, wb)
    emb = wb.by_component.get("embedding", 0)
    output = wb.total_bytes - sum(wb.per_layer) - emb - wb.by_component.get("vision", 0)
    output -= wb.by_component.get("position_embedding", 0) + wb.by_component.get("embedding_extra", 0)
    if spec.tie_word_embeddings:
        output += emb  # no output tensor: Ollama counts token_embd as the output layer
    return Prediction(tuple(kv), full, partial, tuple(wb.per_layer), output)


def place(p: Prediction, free: int | None, overhead: int, num_gpu: int | None) -> Placement:
    """``estimateGPULayers`` on one GPU with ``free`` bytes (None: unlimited): :func:`place_gpus`."""
    return place_gpus(p, (free,), overhead, num_gpu)


def place_gpus(p: Prediction, frees: tuple[int | None, ...], overhead: int, num_gpu: int | None) -> Placement:
    """``estimateGPULayers`` on GPUs with ``frees`` bytes each (None: unlimited); ``num_gpu`` None is
    Ollama's -1 (as many as fit). A GPU takes part when it holds the 457 MiB minimum, two spare layers and
    the graph above ``overhead``; blocks go last first, block ``i`` to the ``i mod j``-th of the ``j`` GPUs
    still taking part, and a GPU it does not fit on stops taking part; the output layer follows on the
    ``count mod j``-th. Each GPU that holds layers adds the graph: the full one only when every layer is
    placed on a single GPU (several GPUs always add the partial graph, "multigpu should always use the
    partial graph size")."""
    n = len(p.layer_bytes)
    g_full = p.graph_partial if len(frees) > 1 else p.graph_full
    graph = max(g_full, p.graph_partial)
    spare = p.layer_bytes[0] + p.kv[0]  # "one layer worth of memory as a buffer"
    alloc, split = [0] * len(frees), [0] * len(frees)
    space = []  # gpusWithSpace
    for i, free in enumerate(frees):
        if free is None or free >= overhead + graph + MINIMUM_MEMORY + 2 * spare:
            space.append(i)
            alloc[i] += MINIMUM_MEMORY + spare

    def fits(g: int, size: int) -> bool:
        free = frees[g]
        return free is None or free > overhead + alloc[g] + graph + size

    count = overflow = 0
    for layer in range(n - 1, -1, -1):
        size = p.layer_bytes[layer] + p.kv[layer]
        if num_gpu is not None and count >= num_gpu:
            overflow += size
            continue
        for j in range(len(space), 0, -1):
            g = space[layer % j]
            if fits(g, size):
                alloc[g] += size
                split[g] += 1
                count += 1
                break
            del space[layer % j]
        if not space:
            overflow += size
    full = count >= n
    if p.output_bytes:
        if num_gpu is None or count < num_gpu:
            for j in range(len(space), 0, -1):
                g = space[count % j]
                if fits(g, p.output_bytes):
                    alloc[g] += p.output_bytes
                    split[g] += 1
                    count += 1
                    break
        if count < n + 1:
            full = False
            overflow += p.output_bytes
    g = g_full if full else p.graph_partial
    alloc = [a + g if k else a for a, k in zip(alloc, split, strict=True)]  # the graph only where layers are
    vram = sum(alloc)
    return Placement(count, vram, vram + overflow, g, full, tuple(split), tuple(alloc))
