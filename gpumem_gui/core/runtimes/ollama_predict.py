"""Ollama's own memory prediction and layer placement (the ``msg=offload ... memory.required.full=...`` line).

Ollama up to v0.12.10 decides how many layers go to the GPU from a prediction, not from llama.cpp's buffers:
``fs/ggml/ggml.go`` ``GraphSize`` (KV bytes per layer and a compute-graph size per architecture, for a full
and a partial offload) and ``llm/memory.go`` ``estimateGPULayers`` (a GPU holds a 457 MiB minimum, one spare
layer, the larger graph and as many layers, last first, as leave it above ``OLLAMA_GPU_OVERHEAD``; then the
output layer). This module writes those rules for one or more GPUs from the model's shapes and the GGUF weight
bytes; the bytes llama.cpp then allocates come from :mod:`.llamacpp`. Hybrid models (``GraphSize`` since
ollama commit 7b91c9c, #12186 "Hybrid and recurrent memory estimates"): a block with attention heads and KV
heads predicts its KV cells, every other block the Mamba state of the GGUF's ``ssm.*`` keys once
(:func:`recurrent_block_bytes`). v0.12.11 (ollama commit f560bd0)
replaced the layout with the Ollama engine's, which measures the graph; v0.30 hands placement to llama-server.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.runtimes.state_pools import llamacpp_state_buffers
from gpumem_gui.core.spec.kinds import LatentAttention, MLPOnly
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.mamba import Mamba1Spec
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.state import has_state
from gpumem_gui.core.units import MiB

# ml/device.go DeviceInfo.MinimumMemory: set aside on a CUDA/ROCm device for context structures
MINIMUM_MEMORY = 457 * MiB
# fs/ggml/ggml.go kvCacheBytesPerElement: Ollama's bytes per K/V element (f16 2; q8_0 1; q4_0 0.5)
OLLAMA_KV_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}
# fs/ggml/ggml.go FlashAttention: architectures whose default is flash attention on (v0.12.10)
FLASH_BY_DEFAULT = ("gemma3", "gptoss", "gpt-oss", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe")
GEMMA3_GLOBAL_EVERY = 6  # ggml.go GraphSize gemma3: every 6th layer is global, the others sliding
GPTOSS_SWA_CELLS = 4096  # ggml.go GraphSize gptoss: Ollama's cells for its sliding layers, per request
# fs/ggml/ggml.go GraphSize: "recurrent always uses F32 in llama.cpp backend", kvCacheBytesPerElement("f32")
OLLAMA_RECURRENT_BYTES = 4


@dataclass(frozen=True)
class Prediction:
    """Ollama's figures for one model and context (``GraphSize``)."""

    kv: tuple[int, ...]  # predicted KV bytes of each block
    graph_full: int
    graph_partial: int
    layer_bytes: tuple[int, ...]  # each block's weights
    output_bytes: int  # output_norm + output (token_embd when tied): memoryLayerOutput
    kv_recurrent: int = 0  # of sum(kv), the blocks GraphSize takes as recurrent ("recurrent bytes")


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


def gguf_head_count_kv(spec: ModelSpec) -> tuple[int, ...]:
    """``attention.head_count_kv`` of each block as the GGUF has it (``KV.HeadCountKV``): the attention
    layers' KV heads; 0 for a hybrid's other blocks (the converters write a per-layer array: Jamba, Granite
    4.0-H, Nemotron-H, LFM2; Falcon-H1's layers all have attention); a dense model's one value."""
    if not has_state(spec):
        return (spec.num_kv_heads,) * spec.num_layers
    out = [0] * spec.num_layers
    for kind in model_kinds(spec).attention:
        for i in kind.layers:
            out[i] = kind.kv_heads
    return tuple(out)


def recurrent_block_bytes(spec: ModelSpec) -> int:
    """What ``GraphSize`` predicts for a block without KV heads, from the GGUF's ``ssm.*`` keys, once (not
    x num_parallel): ``((ssm.conv_kernel - 1) x (ssm.inner_size + 2 x ssm.group_count x ssm.state_size) +
    ssm.state_size x ssm.inner_size) x 4``. Jamba's GGUF has no ``ssm.group_count`` (0); LFM2's has no
    ``ssm.*`` key at all (its short conv writes ``shortconv.l_cache``), so its blocks predict 0; Nemotron-H's
    MLP-only blocks predict this Mamba state too."""
    mb = spec.mamba
    if mb is None:
        return 0
    groups = 0 if isinstance(mb, Mamba1Spec) else mb.groups
    r = (mb.conv_kernel - 1) * (mb.inner + 2 * groups * mb.state_size) if mb.conv_kernel > 0 else 0
    return (r + mb.state_size * mb.inner) * OLLAMA_RECURRENT_BYTES


def _hybrid_kv(spec: ModelSpec, ctx: int, elem: float) -> list[int]:
    """``GraphSize``'s default loop: a block with heads and KV heads gets ``ctx x (key_length +
    value_length) x head_count_kv x elem`` (key_length: the layers' head dim, which llama.cpp needs in the
    GGUF when it is not embedding / heads), any other block :func:`recurrent_block_bytes`."""
    kv = [recurrent_block_bytes(spec)] * spec.num_layers
    for kind in model_kinds(spec).attention:
        width = kind.ollama_width if isinstance(kind, LatentAttention) else sum(kind.kv_elems())
        for i in kind.layers:
            kv[i] = int(ctx * width * elem)
    return kv


def _kv(spec: ModelSpec, ctx: int, batch: int, parallel: int, elem: float) -> list[int]:
    arch = spec.traits.gguf_arch or ""
    if has_state(spec):
        return _hybrid_kv(spec, ctx, elem)
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
    uint64); architectures without a case (the hybrids' among them): llm/memory.go estimateGPULayers'
    partial = HeadCountMax / max(HeadCountKVMin, 1) x KV / 6 (HeadCountKVMin 0 for a hybrid's per-layer
    array: all query heads), full = partial."""
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
    elif arch == "deepseek2" and (mla := model_kinds(spec).latent) is not None:
        hk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
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
        partial = heads // max(min(gguf_head_count_kv(spec)), 1) * kv_total // 6
    if full == 0:
        full = partial
    return full, partial


def predict(
    spec: ModelSpec, wb: WeightBytes, ctx: int, batch: int, parallel: int, kv_type: str, flash: bool
) -> Prediction:
    """``GraphSize(num_ctx, min(num_ctx, num_batch), num_parallel, kv type, flash)``; ``ctx`` is already
    num_ctx x num_parallel (GraphSize multiplies it itself)."""
    kv = _kv(spec, ctx, batch, parallel, OLLAMA_KV_BYTES.get(kv_type, 2.0))
    heads_kv = gguf_head_count_kv(spec)
    recurrent = sum(k for k, h in zip(kv, heads_kv, strict=True) if h == 0)
    full, partial = _graph(spec, ctx, batch, sum(kv), flash, parallel, wb)
    emb = wb.by_component.get("embedding", 0)
    output = wb.total_bytes - sum(wb.per_layer) - emb - wb.by_component.get("vision", 0)
    output -= wb.by_component.get("position_embedding", 0) + wb.by_component.get("embedding_extra", 0)
    if spec.tie_word_embeddings:
        output += emb  # no output tensor: Ollama counts token_embd as the output layer
    return Prediction(tuple(kv), full, partial, tuple(wb.per_layer), output, recurrent)


def recurrent_note(spec: ModelSpec, p: Prediction, parallel: int) -> str:
    """A hybrid's "predicted vs allocated" line: the recurrent bytes Ollama places layers by against the r / s
    buffers its llama runner allocates (``max(1, n_seq_max)`` cells, n_seq_max = num_parallel)."""
    rs = llamacpp_state_buffers(spec, parallel, 0, True)
    kinds = model_kinds(spec)
    why = [f"once, not x num_parallel {parallel}"] if parallel > 1 else []
    if any(k.mixer == "short_conv" for k in kinds.state):
        why.append("0 for short-conv layers, whose GGUF has no ssm.* keys")
    mlp = sum(len(k.layers) for k in kinds.of(MLPOnly))
    if mlp:
        why.append(f"{mlp} MLP-only blocks counted as Mamba blocks")
    attn = {i for k in kinds.attention for i in k.layers}
    if any(i in attn for k in kinds.state for i in k.layers):
        why.append("nothing for layers that also have attention heads")
    return (
        f"Ollama places layers by {p.kv_recurrent / MiB:.1f} MiB of recurrent state (fs/ggml/ggml.go "
        f"GraphSize{': ' + '; '.join(why) if why else ''}); its llama runner allocates "
        f"{(rs['r_bytes'] + rs['s_bytes']) / MiB:.1f} MiB (llama.cpp's RS buffer, {rs['cells']} cells)"
    )


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
