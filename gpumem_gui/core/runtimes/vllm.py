"""The vLLM runtime: a paged KV pool sized from what the profiling run leaves of the memory budget.

``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``: the engine profiles one dummy forward of
``max_num_batched_tokens`` tokens plus a sampler run for ``max_num_seqs`` requests, measures the torch
activation peak and the memory outside torch, captures CUDA graphs, and gives the KV cache everything left
of ``gpu_memory_utilization x total``. KV pages hold 16 tokens per layer (``vllm/v1/kv_cache_interface.py``
``FullAttentionSpec.page_size_bytes``); MLA layers store the latent. Models with sliding-window layers
go through vLLM's hybrid allocator (:mod:`.vllm_kv`: KV groups sharing one pool of blocks; a sliding group
keeps only the window's blocks of a request). A hybrid model with state layers (gated DeltaNet, Mamba,
short conv) goes through it too: the attention block size is raised until one attention page holds one
state page (:mod:`.state_pools`), the state layers form their own groups of one page per request;
DeepSeek-V4's compressed cache has packed groups of its own (:mod:`.vllm_dsv4`). The estimate asks one
protocol of them all, and :mod:`.vllm_layout` picks a model's. Without a GPU capacity the estimate sizes the
KV for ``batch`` sequences of ``seq + new_tokens`` tokens.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, kv_bytes_per_element
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase
from gpumem_gui.core.runtimes import refusals
from gpumem_gui.core.runtimes import state_pools as sp
from gpumem_gui.core.runtimes import vllm_kv as vk
from gpumem_gui.core.runtimes import vllm_layout as vl
from gpumem_gui.core.runtimes import vllm_profile as vp
from gpumem_gui.core.runtimes.base import Runtime, component, load_phase, weights_per_rank
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.vllm_command import vllm_command, vllm_expresses
from gpumem_gui.core.spec.kinds import STATE_MIXERS
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees
from gpumem_gui.core.spec.params import count_params

VLLM_BLOCK_SIZE = 16  # tokens per KV page (vLLM --block-size default; the run's block_size)


def _kv_pool(
    run: InferenceRun,
    capacity: int | None,
    non_kv: int,
    lay: vl.PagedLayout,
    max_len: int,
    batched: int,
) -> tuple[int, str, dict[str, object], tuple[str, ...]]:
    """(KV bytes, formula, facts, warnings): with a GPU capacity, the pool vLLM allocates from what the
    profiling run leaves of the budget, in whole blocks; without one, the blocks the batch needs."""
    bs = run.block_size
    if not capacity:
        if lay.windowed:
            need = run.batch * lay.blocks_per_request(run.tokens, bs, batched, held=True) * lay.block_bytes
            return need, "batch x blocks per request (summed over the KV groups) x bytes per block", {}, ()
        need = run.batch * ceil(run.tokens / bs) * lay.block_bytes
        return need, f"batch x ceil(tokens / {bs}) pages x {bs} x bytes per token (all layers)", {}, ()
    budget = int(capacity * run.gpu_memory_utilization)
    pool = max(0, budget - non_kv)
    blocks = lay.blocks(pool)
    facts: dict[str, object] = {
        "kv_pool_bytes": pool,
        "kv_tokens": lay.reported_tokens(blocks, bs),
        "gpu_blocks": blocks,
        "budget_bytes": budget,
        "gpu_cuda_total_bytes": capacity,
    }
    graphs = "" if vp.graphs_after_kv(run) else " - CUDA graphs"
    head = f"(gpu_memory_utilization x CUDA's total - weights - activations - non-torch{graphs}), "
    if not lay.windowed:  # full attention: one group of every layer
        kv_tokens = blocks * bs
        facts["max_concurrency"] = round(kv_tokens / max_len, 2) if max_len else 0
        warnings: tuple[str, ...] = ()
        if kv_tokens < max_len:
            warnings = (
                f"max_model_len: vLLM would refuse to start: the KV pool holds {kv_tokens} tokens, "
                f"fewer than max_model_len {max_len}",
            )
        return (
            blocks * lay.block_bytes,
            head + f"in whole {bs}-token pages of the rank's layers",
            facts,
            warnings,
        )
    per_request = lay.blocks_per_request(max_len, bs, batched)
    facts["max_concurrency"] = round(blocks / per_request, 2) if per_request else 0
    if lay.request_bytes(per_request) != per_request * lay.block_bytes:  # a block priced above its stride
        facts["kv_request_bytes"] = lay.request_bytes(per_request)  # what vLLM's start-up check needs
    refusal = lay.start_refusal(pool, per_request, max_len)
    return blocks * lay.block_bytes, head + lay.pool_formula(bs), facts, (refusal,) if refusal else ()


def _batch_need(
    lay: vl.PagedLayout,
    run: InferenceRun,
    batched: int,
    max_len: int,
    per_tok: int,
    facts: dict[str, object],
) -> tuple[bool, int, int]:
    """(windowed, blocks or tokens, bytes) the batch's sequences take; with sliding-window layers, the
    blocks over the KV groups (facts gain the groups' shape)."""
    bs = run.block_size
    if not lay.windowed:
        need_blocks = run.batch * ceil(run.tokens / bs)
        return False, need_blocks, need_blocks * bs * per_tok
    kinds = [w[0] for w in lay.windows if w is not None]
    if "chunked" in kinds:  # Llama 4's chunked-local groups
        facts["kv_chunked_groups"] = kinds.count("chunked")
    facts |= {
        "kv_groups": lay.groups,
        "kv_sliding_groups": kinds.count("sliding"),
        "kv_group_layers": lay.group_size,
        "kv_block_bytes": lay.block_bytes,
        "kv_blocks_per_request": lay.blocks_per_request(max_len, bs, batched),
    }
    need_blocks = run.batch * lay.blocks_per_request(run.tokens, bs, batched, held=True)
    return True, need_blocks, need_blocks * lay.block_bytes


def _kv_component(
    run: InferenceRun, lay: vl.PagedLayout, per_tok: int, kv_bytes: int, formula: str
) -> Component:
    """The KV pool's breakdown entry (with the KV groups' shape when some layers slide)."""
    windowed = lay.windowed
    return component(
        "kv_cache",
        "KV cache (paged)",
        kv_bytes,
        formula,
        "vllm/v1/kv_cache_interface.py page_size_bytes; gpu_worker.py determine_available_memory"
        + (
            "; v1/core/kv_cache_utils.py get_kv_cache_config_from_groups (hybrid allocator)"
            if windowed
            else ""
        ),
        per_token_bytes=per_tok,
        batch=run.batch,
        tokens=run.tokens,
        **({"kv_groups": lay.groups, "group_layers": lay.group_size} if windowed else {}),
    )


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
    degrees = Degrees(tp=run.tp, pp=run.pp, ep=run.ep, remainder=vk.VLLM_REMAINDER)
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
    compressed_attention = True  # DeepSeek-V4: vLLM's packed compressed-cache groups (runtimes/vllm_dsv4.py)
    label = "vLLM"
    state_mixers = STATE_MIXERS  # the hybrid KV-cache manager's state groups (runtimes/state_pools.py)
    # the state pages split by TP as the mixers' weights are (vllm/model_executor/layers/mamba/mamba_utils.py
    # MambaStateShapeCalculator: every state shape divides its heads / channels by tp_world_size)
    state_tp = True
    cross_attention_refusal = refusals.VLLM_CROSS_ATTENTION  # mllama: removed after v0.10.2

    def check_state(self, spec: ModelSpec, pp: int) -> None:
        """The hybrids vLLM's allocator is modelled for: attention (MLA too: Kimi-Linear) beside the state
        layers, no sliding-window layers (one-line errors otherwise)."""
        if not sp.attention_layer_count(spec):
            raise GpumemInputError(
                "vllm: a model of state layers only (no attention page to align to) is not modelled",
                field="engine",
            )
        if any(model_kinds(spec).bounds().values()):
            raise GpumemInputError(
                "vllm: the hybrid allocator of a state model beside sliding-window layers is not modelled",
                field="engine",
            )

    sizes_from_capacity = True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        """DeepSeek-V4's path (runtimes/vllm_dsv4.py), and a vision tower in the profiling run
        (runtimes/vllm_encoder.py): a tower that is not replayed counts only its encoder cache; a replayed one
        is the whole tower's replay, which vLLM shards over TP."""
        warnings = vl.check(spec, run)  # the model's layout path (DeepSeek-V4's: runtimes/vllm_dsv4.py)
        if spec.vision is None or run.images_per_prompt == 0:
            return warnings
        if spec.vision.tower is None:
            return [
                *warnings,
                "vllm: the vision encoder's own activations in the profiling run are not modelled for this "
                "tower (its weights and the encoder cache are); --limit-mm-per-prompt image=0 skips them for "
                "text-only serving",
            ]
        if run.tp > 1:
            return [
                *warnings,
                "vllm: the vision encoder's profiling activations are the unsharded tower's (vLLM splits its "
                "heads and MLP over the TP ranks): an upper side",
            ]
        return warnings

    def estimate(
        self,
        spec: ModelSpec,
        run: InferenceRun,
        warnings: tuple[str, ...],
        gpu: GpuMemory | None,
        wb: WeightBytes,
    ) -> Estimate:
        # vLLM budgets on the total CUDA reports: vllm/v1/worker/gpu_worker.py init_device takes
        # MemorySnapshot().total_memory (torch.cuda.mem_get_info()[1]) x gpu_memory_utilization, and its batch
        # defaults read current_platform.get_device_total_memory (the same total)
        capacity = gpu.cuda_bytes if gpu else None
        layers = vp.stage_layers(spec, run.pp)
        kv_elem = kv_bytes_per_element(run.kv_dtype_resolved)
        run, state_facts = vl.block_run(spec, run, kv_elem)  # the block size the model's layout takes
        kv_layers = state_facts.get("attention_layers", vk.kv_stage_layers(spec, run.pp))
        per_tok = vk.kv_per_token(spec, kv_elem, run.tp, kv_layers)
        max_len = run.max_model_len or run.tokens
        tokens, seqs = vp.batch_defaults(run, capacity, max_len, any(model_kinds(spec).bounds().values()))
        lay = vl.layout(spec, run, kv_elem, per_tok, max_len, tokens)
        per_tok = lay.per_token_bytes or per_tok
        weights_c = _weights(spec, run, wb)
        w = weights_c.bytes
        # with what the layout's attention reserves in the dummy run (DeepSeek-V4's prefill workspace)
        activation = lay.profiled(vp.activation(spec, run, tokens, seqs, last_stage=True, max_len=max_len))
        non_torch = vp.non_torch(run, capacity)
        graphs = vp.cudagraphs(spec, run, seqs, layers)
        non_kv = w + activation.bytes + non_torch.bytes + (0 if vp.graphs_after_kv(run) else graphs.bytes)
        facts: dict[str, object] = {
            "kv_bytes_per_token": per_tok,
            "block_size": run.block_size,
            "max_model_len": max_len,
            "max_num_batched_tokens": tokens,
            "max_num_seqs": seqs,
            "stage_layers": layers,
            **state_facts,
        }
        bs = run.block_size
        windowed, need_blocks, need_kv = _batch_need(lay, run, tokens, max_len, per_tok, facts)
        kv_bytes, kv_formula, pool_facts, pool_warnings = _kv_pool(
            run, capacity, non_kv, lay, max_len, tokens
        )
        facts.update(pool_facts)
        warnings = (*warnings, *pool_warnings)
        kv_c = _kv_component(run, lay, per_tok, kv_bytes, kv_formula)
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
        facts["kv_blocks_needed" if windowed else "kv_tokens_needed"] = (
            need_blocks if windowed else need_blocks * bs
        )
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
        if "kv_blocks_per_request" in est.facts:  # sliding-window layers: blocks over the KV groups
            blocks = int(est.facts["gpu_blocks"])  # type: ignore[call-overload]
            need = max(int(est.facts["kv_blocks_per_request"]), int(est.facts["kv_blocks_needed"]))  # type: ignore[call-overload]
            guard = int(est.facts.get("kv_request_bytes", 0))  # type: ignore[call-overload]
            return blocks >= need and int(est.facts["kv_pool_bytes"]) >= guard  # type: ignore[call-overload]
        kv_tokens = int(est.facts["kv_tokens"])  # type: ignore[call-overload]
        need_tokens = int(est.facts.get("kv_tokens_needed", 0))  # type: ignore[call-overload]
        return kv_tokens >= int(est.facts.get("max_model_len", 0)) and kv_tokens >= need_tokens  # type: ignore[call-overload]

    def max_concurrency(self, est: Estimate) -> float | None:
        if "max_concurrency" not in est.facts:
            return None
        return float(est.facts["max_concurrency"])  # type: ignore[arg-type]

    # the run fields ``vllm serve`` has no option for (Runtime.unexpressed)
    unexpressed = (
        ("batch", "the requests sent to the server"),
        ("seq", "the requests' prompt tokens"),
        ("new_tokens", "the requests' new tokens"),
        ("tp_link", "the GPUs' interconnect, which vLLM detects"),
        ("cuda_context_mib", "the driver's CUDA context"),
    )

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        return super().expresses(spec, run, source, checkpoint) or vllm_expresses(run, checkpoint)

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        return self.with_unsaid(run, vllm_command(model, run, est))


VLLM = Vllm()
