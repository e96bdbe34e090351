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
from gpumem_gui.core.runtimes import vllm_profile as vp
from gpumem_gui.core.runtimes.base import Runtime, component, load_phase, weights_per_rank
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees
from gpumem_gui.core.spec.params import count_params

VLLM_BLOCK_SIZE = 16  # tokens per KV page (vLLM --block-size default; the run's block_size)


def kv_per_token(spec: ModelSpec, kv_elem: float, tp: int, layers: int | None = None) -> int:
    """KV bytes one token costs over ``layers`` layers (default: all) on one TP rank (K and V, KV heads
    split, at least one; MLA layers store the latent and its rope part, replicated)."""
    n = spec.num_layers if layers is None else layers
    if spec.mla is not None:
        return round(n * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * kv_elem)
    kvh = max(1, spec.num_kv_heads // tp)
    return round(n * 2 * kvh * spec.head_dim * kv_elem)


def _kv_pool(
    run: InferenceRun, capacity: int | None, non_kv: int, per_tok: int, max_len: int
) -> tuple[int, str, dict[str, object], tuple[str, ...]]:
    """(KV bytes, formula, facts, warnings): with a GPU capacity, the pool vLLM allocates from what the
    profiling run leaves of the budget, in whole pages; without one, the pages the batch needs."""
    bs = run.block_size
    if not capacity:
        need = run.batch * ceil(run.tokens / bs) * bs * per_tok
        return need, f"batch x ceil(tokens / {bs}) pages x {bs} x bytes per token (all layers)", {}, ()
    budget = int(capacity * run.gpu_memory_utilization)
    pool = max(0, budget - non_kv)
    blocks = pool // (bs * per_tok) if per_tok else 0
    kv_tokens = blocks * bs
    facts: dict[str, object] = {
        "kv_pool_bytes": pool,
        "kv_tokens": kv_tokens,
        "gpu_blocks": blocks,
        "budget_bytes": budget,
        "max_concurrency": round(kv_tokens / max_len, 2) if max_len else 0,
    }
    warnings: tuple[str, ...] = ()
    if kv_tokens < max_len:
        warnings = (
            f"max_model_len: vLLM would refuse to start: the KV pool holds {kv_tokens} tokens, "
            f"fewer than max_model_len {max_len}",
        )
    graphs = " - CUDA graphs" if run.profile_cudagraphs else ""
    formula = (
        f"(gpu_memory_utilization x capacity - weights - activations - non-torch{graphs}), "
        f"in whole {bs}-token pages of the rank's layers"
    )
    return blocks * bs * per_tok, formula, facts, warnings


def _weights(spec: ModelSpec, run: InferenceRun, wb: WeightBytes) -> Component:
    """The fullest rank's weights: divided over TP (norms replicated); with pipeline stages, the largest
    stage's share (embeddings on the first, head on the last)."""
    if run.pp == 1:
        return Component(
            key="weights",
            label=f"weights ({run.weights})",
            bytes=weights_per_rank(wb, run.tp),
            explain=wb.explain,
        )
    degrees = Degrees(tp=run.tp, pp=run.pp, ep=run.ep)
    stages = [load_phase(spec, run, True, degrees, s, wb)[0] for s in range(run.pp)]
    return max(stages, key=lambda c: c.bytes)


def _phases(weights_c: Component, activation: Component, kv_c: Component) -> dict[str, Phase]:
    """Load (weights), profile (weights + the profiled peak), serve (+ the KV pool, allocated up front)."""
    w = weights_c.bytes
    return {
        "load": Phase(name="load", peak_bytes=w, components=(weights_c,)),
        "profile": Phase(name="profile", peak_bytes=w + activation.bytes, components=(weights_c, activation)),
        "serve": Phase(
            name="serve",
            peak_bytes=w + activation.bytes + kv_c.bytes,
            components=(weights_c, activation, kv_c),
            note="the KV pool is allocated up front; activations reuse the profiled space",
        ),
    }


class Vllm(Runtime):
    name = "vllm"
    label = "vLLM"
    sizes_from_capacity = True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """Sliding-window layers: vLLM's hybrid allocator frees their pages beyond the window; the estimate
        sizes every layer for the full length (an upper bound on their KV)."""
        if "sliding_attention" in spec.resolved_layer_types:
            return [
                "vllm: sliding-window layers are sized for the full context (vLLM's hybrid KV allocator "
                "keeps only the window's pages for them; the KV is an upper bound)"
            ]
        return []

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        capacity: int | None,
        wb: WeightBytes,
    ) -> Estimate:
        layers = vp.stage_layers(spec, run.pp)
        per_tok = kv_per_token(spec, kv_bytes_per_element(run.kv_dtype_resolved), run.tp, layers)
        max_len = run.max_model_len or run.tokens
        tokens, seqs = vp.batch_defaults(run, capacity)
        weights_c = _weights(spec, run, wb)
        w = weights_c.bytes
        activation = vp.activation(spec, run, tokens, seqs, last_stage=True)
        non_torch = vp.non_torch(run, capacity)
        graphs = vp.cudagraphs(spec, run, seqs, layers)
        non_kv = w + activation.bytes + non_torch.bytes + (graphs.bytes if run.profile_cudagraphs else 0)
        facts: dict[str, object] = {
            "kv_bytes_per_token": per_tok,
            "block_size": run.block_size,
            "max_model_len": max_len,
            "max_num_batched_tokens": tokens,
            "max_num_seqs": seqs,
            "stage_layers": layers,
        }
        bs = run.block_size
        need_blocks = run.batch * ceil(run.tokens / bs)
        need_kv = need_blocks * bs * per_tok
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
        phases = _phases(weights_c, activation, kv_c)
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
        facts["kv_tokens_needed"] = need_blocks * bs
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
        if run.max_num_seqs:
            args += ["--max-num-seqs", str(run.max_num_seqs)]
        if run.max_num_batched_tokens:
            args += ["--max-num-batched-tokens", str(run.max_num_batched_tokens)]
        if run.block_size != VLLM_BLOCK_SIZE:
            args += ["--block-size", str(run.block_size)]
        if run.enforce_eager:
            args.append("--enforce-eager")
        elif run.max_cudagraph_capture_size:
            args += ["--max-cudagraph-capture-size", str(run.max_cudagraph_capture_size)]
        if not run.profile_cudagraphs:
            args = ["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0", *args]
        return shlex.join(args)


VLLM = Vllm()
