"""Runtime profiles other than transformers: vLLM and llama.cpp.

**vLLM** (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``): the engine profiles one dummy
forward of ``max_num_batched_tokens`` tokens plus a sampler run for ``max_num_seqs`` requests, measures the
torch activation peak and the memory outside torch, captures CUDA graphs, and gives the KV cache everything
left of ``gpu_memory_utilization x total``. KV pages hold 16 tokens per layer
(``vllm/v1/kv_cache_interface.py`` ``FullAttentionSpec.page_size_bytes``); MLA layers store the latent.
Without a GPU capacity the estimate sizes the KV for ``batch`` sequences of ``seq + new_tokens`` tokens.

**llama.cpp** (``src/llama-model.cpp``, ``src/llama-kv-cache.cpp``, ``ggml-backend``): a model buffer with the
offloaded layers (``-ngl``; the token embedding stays in host memory, the output layer is offloaded with the
last layer), a KV buffer of ``n_ctx`` cells for the offloaded layers, and a compute buffer sized for one
``n_ubatch`` micro-batch.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.formats import WeightBytes, kv_bytes_per_element
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, Phase
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.units import GiB, MiB

VLLM_BLOCK_SIZE = 16  # tokens per KV page (vLLM --block-size default)
# vLLM default max_num_batched_tokens for the OpenAI server on large GPUs (vllm/engine/arg_utils.py,
# default_max_num_batched_tokens[UsageContext.OPENAI_API_SERVER] = 8192).
VLLM_DEFAULT_BATCHED_TOKENS = 8192
# Memory outside the torch allocator in one vLLM worker (CUDA context, cuBLAS/cuDNN, NCCL): published profile
# "non_torch_memory 1.79GiB" (Llama-3-8B, H100, tp 1; shared/reference/published,
# id inf-vllm-llama3-8b-tp1-weights).
VLLM_NON_TORCH_BYTES = round(1.79 * GiB)
# NCCL buffers per extra TP peer: NCCL_BUFFSIZE default 4 MiB per channel and peer, up to 32 channels
# (NCCL docs, "NCCL_BUFFSIZE"; 2 x 32 x 4 MiB = 256 MiB per peer for send and receive).
NCCL_BYTES_PER_PEER = 256 * MiB
# CUDA-graph pool: "0.65 GiB for CUDAGraph memory" for 34-layer gemma-3-4b (vLLM PR #21489 log); the pool
# grows with the number of captured layers, so we scale by layers.
VLLM_CUDAGRAPH_BYTES_PER_LAYER = round(0.65 * GiB / 34)


def _weights(wb: WeightBytes, tp: int) -> tuple[int, Explanation]:
    norms = wb.by_component.get("norms", 0)
    per_rank = round((wb.total_bytes - norms) / tp + norms)
    return per_rank, wb.explain


def _kv_per_token(spec: ModelSpec, kv_elem: float, tp: int, *, mla_latent: bool = True) -> int:
    """KV bytes one token costs over all layers on one TP rank (K and V, KV heads split, at least one)."""
    if spec.mla is not None and mla_latent:
        return round(spec.num_layers * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * kv_elem)
    if spec.mla is not None:
        a = spec.num_attention_heads
        width = a * spec.mla.qk_head_dim + a * spec.mla.v_head_dim
        return round(spec.num_layers * width * kv_elem / tp)
    kvh = max(1, spec.num_kv_heads // tp)
    return round(spec.num_layers * 2 * kvh * spec.head_dim * kv_elem)


def estimate_engine(
    spec: ModelSpec, run: object, warnings: tuple[str, ...], capacity: int | None, wb: WeightBytes
) -> Estimate:
    if run.engine == "vllm":  # type: ignore[attr-defined]
        return estimate_vllm(spec, run, warnings, capacity, wb)
    return estimate_llamacpp(spec, run, warnings, wb)


def _comp(key: str, label: str, n: int, formula: str, source: str, **inputs: object) -> Component:
    return Component(
        key=key,
        label=label,
        bytes=max(0, int(n)),
        explain=Explanation(formula=formula, inputs=inputs, source=source),
    )


def estimate_vllm(
    spec: ModelSpec, run: object, warnings: tuple[str, ...], capacity: int | None, wb: WeightBytes
) -> Estimate:
    r = run
    tp = r.tp  # type: ignore[attr-defined]
    dt = r.dt  # type: ignore[attr-defined]
    w, wexp = _weights(wb, tp)
    kv_elem = kv_bytes_per_element(r.kv_dtype_resolved)  # type: ignore[attr-defined]
    per_tok = _kv_per_token(spec, kv_elem, tp)
    max_len = r.max_model_len or r.tokens  # type: ignore[attr-defined]
    t = r.max_num_batched_tokens or max(VLLM_DEFAULT_BATCHED_TOKENS, 0)  # type: ignore[attr-defined]
    seqs = r.max_num_seqs  # type: ignore[attr-defined]
    h = spec.hidden_size
    f = (
        spec.moe.expert_intermediate_size * spec.moe.experts_per_token
        + spec.moe.shared_expert_intermediate_size
        if spec.moe
        else spec.intermediate_size
    )
    qkv = spec.q_width + 2 * spec.kv_width
    per_token_act = 2 * h * dt + max(3 * f * dt // tp, (qkv + spec.q_width) * dt // tp)
    act = t * per_token_act
    vocab = ceil(spec.vocab_size / tp)
    sampler = seqs * vocab * (dt + 2 * 4)
    activation = _comp(
        "activations",
        "profiled activation peak",
        act + sampler,
        "T x (2h + max(3F, qkv + q)) x dt / tp + max_num_seqs x vocab x (dt + 8): the dummy forward of "
        "max_num_batched_tokens tokens and the sampler's logits/probs in fp32",
        "vllm/v1/worker/gpu_model_runner.py profile_run, _dummy_sampler_run",
        T=t,
        h=h,
        F=f,
        max_num_seqs=seqs,
        vocab=vocab,
    )
    non_torch = VLLM_NON_TORCH_BYTES + (tp - 1) * NCCL_BYTES_PER_PEER
    non_torch_c = _comp(
        "non_torch",
        "non-torch memory (CUDA context, cuBLAS, NCCL)",
        non_torch,
        "1.79 GiB measured for one worker + 256 MiB NCCL buffers per extra TP peer",
        "vLLM profile log (shared/reference/published inf-vllm-llama3-8b-tp1-weights); NCCL_BUFFSIZE docs",
        tp=tp,
    )
    graphs = 0 if r.enforce_eager else spec.num_layers * VLLM_CUDAGRAPH_BYTES_PER_LAYER  # type: ignore[attr-defined]
    graphs_c = _comp(
        "cudagraph",
        "CUDA graphs",
        graphs,
        "0.65 GiB per 34 layers, scaled by layers (0 with --enforce-eager)",
        "vLLM PR #21489 log (gemma-3-4b: 0.65 GiB for CUDAGraph memory)",
        layers=spec.num_layers,
        enforce_eager=r.enforce_eager,  # type: ignore[attr-defined]
    )
    weights_c = Component(key="weights", label=f"weights ({r.weights})", bytes=w, explain=wexp)  # type: ignore[attr-defined]
    non_kv = w + act + sampler + non_torch + graphs
    facts: dict[str, object] = {
        "kv_bytes_per_token": per_tok,
        "block_size": VLLM_BLOCK_SIZE,
        "max_model_len": max_len,
    }
    batch, tokens = r.batch, r.tokens  # type: ignore[attr-defined]
    need_blocks = batch * ceil(tokens / VLLM_BLOCK_SIZE)
    need_kv = need_blocks * VLLM_BLOCK_SIZE * per_tok
    if capacity:
        budget = int(capacity * r.gpu_memory_utilization)  # type: ignore[attr-defined]
        pool = max(0, budget - non_kv)
        blocks = pool // (VLLM_BLOCK_SIZE * per_tok) if per_tok else 0
        kv_tokens = blocks * VLLM_BLOCK_SIZE
        facts.update(
            kv_pool_bytes=pool,
            kv_tokens=kv_tokens,
            budget_bytes=budget,
            max_concurrency=round(kv_tokens / max_len, 2) if max_len else 0,
        )
        kv_bytes = blocks * VLLM_BLOCK_SIZE * per_tok
        kv_formula = (
            "(gpu_memory_utilization x capacity - weights - activations - non-torch - CUDA graphs), "
            "in whole 16-token pages of all layers"
        )
        if kv_tokens < max_len:
            warnings = (
                *warnings,
                f"max_model_len: vLLM would refuse to start: the KV pool holds {kv_tokens} tokens, "
                f"fewer than max_model_len {max_len}",
            )
    else:
        kv_bytes = need_kv
        kv_formula = "batch x ceil(tokens / 16) pages x 16 x bytes per token (all layers)"
    kv_c = _comp(
        "kv_cache",
        "KV cache (paged)",
        kv_bytes,
        kv_formula,
        "vllm/v1/kv_cache_interface.py page_size_bytes; gpu_worker.py determine_available_memory",
        per_token_bytes=per_tok,
        batch=batch,
        tokens=tokens,
    )
    torch_part = w + act + sampler + kv_bytes
    comps = (weights_c, activation, kv_c, non_torch_c, graphs_c)
    total = torch_part + non_torch + graphs
    phases = {
        "load": Phase(name="load", peak_bytes=w, components=(weights_c,)),
        "profile": Phase(name="profile", peak_bytes=w + act + sampler, components=(weights_c, activation)),
        "serve": Phase(
            name="serve",
            peak_bytes=torch_part,
            components=(weights_c, activation, kv_c),
            note="the KV pool is allocated up front; activations reuse the profiled space",
        ),
    }
    per_gpu = tuple(
        GpuShare(
            index=i,
            role=f"TP rank {i % tp}, PP stage {i // tp}",
            peak_bytes=torch_part,
            total_bytes=total,
            components=comps,
        )
        for i in range(r.gpus)  # type: ignore[attr-defined]
    )
    facts["params_total"] = count_params(spec).total
    facts["kv_needed_for_batch_bytes"] = need_kv
    facts["kv_tokens_needed"] = need_blocks * VLLM_BLOCK_SIZE
    return Estimate(
        mode="inference",
        engine="vllm",
        phases=phases,
        peak_phase="serve",
        peak_bytes=torch_part,
        total_bytes=total,
        components=comps,
        per_gpu=per_gpu,
        kv_cache_bytes=need_kv,
        warnings=warnings,
        facts=facts,
    )  # type: ignore[arg-type]


def estimate_llamacpp(spec: ModelSpec, run: object, warnings: tuple[str, ...], wb: WeightBytes) -> Estimate:
    r = run
    fmt = r.weights  # type: ignore[attr-defined]
    n_layers = spec.num_layers
    ngl = r.n_gpu_layers  # type: ignore[attr-defined]
    offloaded = n_layers if ngl < 0 or ngl > n_layers else ngl
    output_on_gpu = ngl < 0 or ngl > n_layers
    layers_gpu = sum(wb.per_layer[n_layers - offloaded :])  # llama.cpp offloads the last layers first
    embeddings = sum(
        wb.by_component.get(k, 0) for k in ("embedding", "position_embedding", "embedding_extra", "vision")
    )
    head = wb.total_bytes - sum(wb.per_layer) - embeddings  # output norm + output layer
    if spec.tie_word_embeddings:
        head += wb.by_component.get("embedding", 0)  # the output layer reuses token_embd, copied to the GPU
    model_gpu = layers_gpu + (head if output_on_gpu else 0)
    model_cpu = wb.total_bytes - model_gpu
    kv_elem = kv_bytes_per_element(r.kv_dtype_resolved)  # type: ignore[attr-defined]
    n_ctx = r.batch * r.tokens  # type: ignore[attr-defined]
    if spec.mla is not None:
        # llama.cpp caches the MLA latent: K = kv_lora_rank + rope, V = kv_lora_rank (published log)
        width = 2 * spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    else:
        width = 2 * spec.num_kv_heads * spec.head_dim
    # every offloaded layer of one attention type holds the same cells
    swa_layers = spec.resolved_layer_types[n_layers - offloaded :].count("sliding_attention")
    swa_cells = n_ctx
    if swa_layers and spec.sliding_window:
        # llama_kv_cache_iswa: SWA layers keep min(n_ctx, pad(n_swa * n_seq + n_ubatch, 256)) cells
        swa_cells = min(n_ctx, ceil((spec.sliding_window * r.batch + r.n_ubatch) / 256) * 256)  # type: ignore[attr-defined]
    kv_gpu = (offloaded - swa_layers) * round(n_ctx * width * kv_elem) + swa_layers * round(
        swa_cells * width * kv_elem
    )
    ub = min(r.n_ubatch, n_ctx)  # type: ignore[attr-defined]
    h = spec.hidden_size
    f = spec.moe.expert_intermediate_size * spec.moe.experts_per_token if spec.moe else spec.intermediate_size
    # ggml's graph allocator reuses memory between the stages of one micro-batch, so the buffer is the
    # largest stage, not the sum (ggml/src/ggml-alloc.c): f32 tensors of n_ubatch rows each.
    row = ub * h * 4  # one hidden-state tensor
    stages = {
        # logits of the micro-batch and the normed hidden state feeding them
        "output": ub * spec.vocab_size * 4 + row,
        # gate and up projections (x experts used per token) and their product
        "ffn": 2 * ub * f * 4 + 2 * row,
        # without flash attention the KQ matrix [n_kv, n_ubatch, n_head] is materialised in f32; with it,
        # only per-head tiles; plus q/k/v/out rows
        "attention": (0 if r.flash_attn else ub * n_ctx * spec.num_attention_heads * 4) + 4 * row,  # type: ignore[attr-defined]
    }
    stage = max(stages, key=lambda k: stages[k])
    compute = stages[stage]
    weights_c = _comp(
        "weights",
        f"model buffer ({fmt}, {offloaded}/{n_layers} layers on GPU)",
        model_gpu,
        "offloaded layers' tensors + output layer when all layers are offloaded",
        "llama.cpp src/llama-model.cpp load_tensors (token_embd stays in host memory)",
        offloaded=offloaded,
        n_layers=n_layers,
    )
    kv_c = _comp(
        "kv_cache",
        "KV buffer",
        kv_gpu,
        "n_ctx cells x (K + V width) x type size per offloaded layer",
        "llama.cpp src/llama-kv-cache.cpp",
        n_ctx=n_ctx,
        kv_type=r.kv_dtype_resolved,
    )  # type: ignore[attr-defined]
    compute_c = _comp(
        "compute_buffer",
        "compute buffer",
        compute,
        "largest graph stage of one micro-batch, f32: output (n_ubatch x vocab + row), FFN "
        "(2 x n_ubatch x F_used + 2 rows) or attention (n_ubatch x n_ctx x heads without flash attention "
        "+ 4 rows); row = n_ubatch x hidden x 4 B",
        "ggml/src/ggml-alloc.c (buffers reused between stages); checked against published llama.cpp logs "
        "(docs/validation.md)",
        n_ubatch=ub,
        flash_attn=r.flash_attn,  # type: ignore[attr-defined]
        stage=stage,
    )
    ctx = _comp(
        "cuda_context",
        "CUDA context",
        r.cuda_context_mib * MiB,
        "fixed per process",  # type: ignore[attr-defined]
        "see gpumem_gui/core/results/overheads.py",
    )
    comps = (weights_c, kv_c, compute_c, ctx)
    peak = model_gpu + kv_gpu + compute
    total = peak + ctx.bytes
    phases = {
        "load": Phase(name="load", peak_bytes=model_gpu + kv_gpu, components=(weights_c, kv_c)),
        "decode": Phase(name="decode", peak_bytes=peak, components=(weights_c, kv_c, compute_c)),
    }
    return Estimate(
        mode="inference",
        engine="llama.cpp",
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
