"""The vLLM runtime: a paged KV pool sized from what the profiling run leaves of the memory budget.

``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``: the engine profiles one dummy forward of
``max_num_batched_tokens`` tokens plus a sampler run for ``max_num_seqs`` requests, measures the torch
activation peak and the memory outside torch, captures CUDA graphs, and gives the KV cache everything left
of ``gpu_memory_utilization x total``. KV pages hold 16 tokens per layer (``vllm/v1/kv_cache_interface.py``
``FullAttentionSpec.page_size_bytes``); MLA layers store the latent. Without a GPU capacity the estimate
sizes the KV for ``batch`` sequences of ``seq + new_tokens`` tokens.
"""

from __future__ import annotations

import shlex
from math import ceil

from gpumem_gui.core.formats import WeightBytes, kv_bytes_per_element
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.runtimes.base import Runtime, component, weights_per_rank
from gpumem_gui.core.runtimes.run import InferenceRun
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


def kv_per_token(spec: ModelSpec, kv_elem: float, tp: int) -> int:
    """KV bytes one token costs over all layers on one TP rank (K and V, KV heads split, at least one; MLA
    layers store the latent and its rope part, replicated)."""
    if spec.mla is not None:
        return round(spec.num_layers * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * kv_elem)
    kvh = max(1, spec.num_kv_heads // tp)
    return round(spec.num_layers * 2 * kvh * spec.head_dim * kv_elem)


def _activation(spec: ModelSpec, run: InferenceRun) -> Component:
    """The profiled peak: one dummy forward of ``max_num_batched_tokens`` and the sampler's buffers."""
    tp, dt = run.tp, run.dt
    t = run.max_num_batched_tokens or VLLM_DEFAULT_BATCHED_TOKENS
    h = spec.hidden_size
    f = (
        spec.moe.expert_intermediate_size * spec.moe.experts_per_token
        + spec.moe.shared_expert_intermediate_size
        if spec.moe
        else spec.intermediate_size
    )
    qkv = spec.q_width + 2 * spec.kv_width
    per_token_act = 2 * h * dt + max(3 * f * dt // tp, (qkv + spec.q_width) * dt // tp)
    vocab = ceil(spec.vocab_size / tp)
    sampler = run.max_num_seqs * vocab * (dt + 2 * 4)
    return component(
        "activations",
        "profiled activation peak",
        t * per_token_act + sampler,
        "T x (2h + max(3F, qkv + q)) x dt / tp + max_num_seqs x vocab x (dt + 8): the dummy forward of "
        "max_num_batched_tokens tokens and the sampler's logits/probs in fp32",
        "vllm/v1/worker/gpu_model_runner.py profile_run, _dummy_sampler_run",
        T=t,
        h=h,
        F=f,
        max_num_seqs=run.max_num_seqs,
        vocab=vocab,
    )


def _overheads(spec: ModelSpec, run: InferenceRun) -> tuple[Component, Component]:
    """Memory outside torch's allocator (context, libraries, NCCL) and the CUDA-graph pool."""
    non_torch = component(
        "non_torch",
        "non-torch memory (CUDA context, cuBLAS, NCCL)",
        VLLM_NON_TORCH_BYTES + (run.tp - 1) * NCCL_BYTES_PER_PEER,
        "1.79 GiB measured for one worker + 256 MiB NCCL buffers per extra TP peer",
        "vLLM profile log (shared/reference/published inf-vllm-llama3-8b-tp1-weights); NCCL_BUFFSIZE docs",
        tp=run.tp,
    )
    graphs = component(
        "cudagraph",
        "CUDA graphs",
        0 if run.enforce_eager else spec.num_layers * VLLM_CUDAGRAPH_BYTES_PER_LAYER,
        "0.65 GiB per 34 layers, scaled by layers (0 with --enforce-eager)",
        "vLLM PR #21489 log (gemma-3-4b: 0.65 GiB for CUDAGraph memory)",
        layers=spec.num_layers,
        enforce_eager=run.enforce_eager,
    )
    return non_torch, graphs


def _kv_pool(
    run: InferenceRun, capacity: int | None, non_kv: int, per_tok: int, max_len: int
) -> tuple[int, str, dict[str, object], tuple[str, ...]]:
    """(KV bytes, formula, facts, warnings): with a GPU capacity, the pool vLLM allocates from what the
    profiling run leaves of the budget, in whole pages; without one, the pages the batch needs."""
    if not capacity:
        need = run.batch * ceil(run.tokens / VLLM_BLOCK_SIZE) * VLLM_BLOCK_SIZE * per_tok
        return need, "batch x ceil(tokens / 16) pages x 16 x bytes per token (all layers)", {}, ()
    budget = int(capacity * run.gpu_memory_utilization)
    pool = max(0, budget - non_kv)
    blocks = pool // (VLLM_BLOCK_SIZE * per_tok) if per_tok else 0
    kv_tokens = blocks * VLLM_BLOCK_SIZE
    facts: dict[str, object] = {
        "kv_pool_bytes": pool,
        "kv_tokens": kv_tokens,
        "budget_bytes": budget,
        "max_concurrency": round(kv_tokens / max_len, 2) if max_len else 0,
    }
    warnings: tuple[str, ...] = ()
    if kv_tokens < max_len:
        warnings = (
            f"max_model_len: vLLM would refuse to start: the KV pool holds {kv_tokens} tokens, "
            f"fewer than max_model_len {max_len}",
        )
    formula = (
        "(gpu_memory_utilization x capacity - weights - activations - non-torch - CUDA graphs), "
        "in whole 16-token pages of all layers"
    )
    return blocks * VLLM_BLOCK_SIZE * per_tok, formula, facts, warnings


class Vllm(Runtime):
    name = "vllm"
    label = "vLLM"
    sizes_from_capacity = True

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        capacity: int | None,
        wb: WeightBytes,
    ) -> Estimate:
        w = weights_per_rank(wb, run.tp)
        per_tok = kv_per_token(spec, kv_bytes_per_element(run.kv_dtype_resolved), run.tp)
        max_len = run.max_model_len or run.tokens
        activation = _activation(spec, run)
        non_torch, graphs = _overheads(spec, run)
        weights_c = Component(key="weights", label=f"weights ({run.weights})", bytes=w, explain=wb.explain)
        non_kv = w + activation.bytes + non_torch.bytes + graphs.bytes
        facts: dict[str, object] = {
            "kv_bytes_per_token": per_tok,
            "block_size": VLLM_BLOCK_SIZE,
            "max_model_len": max_len,
        }
        need_blocks = run.batch * ceil(run.tokens / VLLM_BLOCK_SIZE)
        need_kv = need_blocks * VLLM_BLOCK_SIZE * per_tok
        kv_bytes, kv_formula, pool_facts, pool_warnings = _kv_pool(run, capacity, non_kv, per_tok, max_len)
        facts.update(pool_facts)
        warnings = (*warnings, *pool_warnings)
        kv_c = component(
            "kv_cache",
            "KV cache (paged)",
            kv_bytes,
            kv_formula,
            "vllm/v1/kv_cache_interface.py page_size_bytes; gpu_worker.py determine_available_memory",
            per_token_bytes=per_tok,
            batch=run.batch,
            tokens=run.tokens,
        )
        torch_part = w + activation.bytes + kv_bytes
        comps = (weights_c, activation, kv_c, non_torch, graphs)
        total = torch_part + non_torch.bytes + graphs.bytes
        phases = {
            "load": Phase(name="load", peak_bytes=w, components=(weights_c,)),
            "profile": Phase(
                name="profile", peak_bytes=w + activation.bytes, components=(weights_c, activation)
            ),
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
                role=f"TP rank {i % run.tp}, PP stage {i // run.tp}",
                peak_bytes=torch_part,
                total_bytes=total,
                components=comps,
            )
            for i in range(run.gpus)
        )
        facts["params_total"] = count_params(spec).total
        facts["kv_needed_for_batch_bytes"] = need_kv
        facts["kv_tokens_needed"] = need_blocks * VLLM_BLOCK_SIZE
        return Estimate(
            mode="inference",
            engine=self.name,
            phases=phases,
            peak_phase="serve",
            peak_bytes=torch_part,
            total_bytes=total,
            components=comps,
            per_gpu=per_gpu,
            kv_cache_bytes=need_kv,
            warnings=warnings,
            facts=facts,
        )

    def needed_bytes(self, est: Estimate, share: GpuShare) -> int:
        """vLLM takes ``gpu_memory_utilization x total`` whatever the batch: that budget must be free."""
        return int(est.facts.get("budget_bytes", share.total_bytes))  # type: ignore[call-overload]

    def admits(self, est: Estimate) -> bool:
        """vLLM starts only if one ``max_model_len`` request fits in the pool; the batch runs at once only if
        all its sequences' pages fit."""
        if "kv_tokens" not in est.facts:
            return True
        kv_tokens = int(est.facts["kv_tokens"])  # type: ignore[call-overload]
        need_tokens = int(est.facts.get("kv_tokens_needed", 0))  # type: ignore[call-overload]
        return kv_tokens >= int(est.facts.get("max_model_len", 0)) and kv_tokens >= need_tokens  # type: ignore[call-overload]

    def max_concurrency(self, est: Estimate) -> float | None:
        if "max_concurrency" not in est.facts:
            return None
        return float(est.facts["max_concurrency"])  # type: ignore[arg-type]

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        max_len = run.max_model_len or int(est.facts.get("max_model_len", run.tokens) or run.tokens)  # type: ignore[call-overload]
        args = [
            "vllm",
            "serve",
            model,
            "--max-model-len",
            str(max_len),
            "--gpu-memory-utilization",
            f"{run.gpu_memory_utilization:g}",
            "--kv-cache-dtype",
            run.kv_dtype,
            "--tensor-parallel-size",
            str(run.tp),
        ]
        if run.pp > 1:
            args += ["--pipeline-parallel-size", str(run.pp)]
        if run.ep > 1:
            args.append("--enable-expert-parallel")
        if run.max_num_seqs != InferenceRun.model_fields["max_num_seqs"].default:
            args += ["--max-num-seqs", str(run.max_num_seqs)]
        if run.max_num_batched_tokens:
            args += ["--max-num-batched-tokens", str(run.max_num_batched_tokens)]
        if run.enforce_eager:
            args.append("--enforce-eager")
        return shlex.join(args)


VLLM = Vllm()
