"""The SGLang runtime: weights and a token-to-KV pool inside ``mem_fraction_static`` of the free memory.

What one SGLang GPU (a TP rank of one pipeline stage) holds, in the order the server allocates it
(``python/sglang/srt/model_executor/model_runner.py`` and ``mem_cache/``):

1. before loading: the CUDA context and NCCL (what ``Load weight begin. avail mem=P`` leaves free);
2. the weights of its shard (``Load weight end ... mem usage``);
3. the KV pool: ``max_total_num_tokens = (P x mem_fraction_static - weights) / cell`` whole tokens
   (``profile_max_num_token`` / ``_profile_available_bytes``: rest = free after load - P x (1 - fraction)),
   ``cell`` = KV heads per attention-TP rank x (head_dim + v_head_dim) x layers x dtype bytes (MLA: the
   latent kv_lora_rank + qk_rope_head_dim), at most ``--max-total-tokens``, in whole ``--page-size`` pages;
   the buffers hold one page more (``MHATokenToKVPool``); a hybrid sliding-window model splits the budget
   between a full and an SWA pool by ``swa_full_tokens_ratio`` (:mod:`.sglang_swa`);
4. the request pool ``ReqToTokenPool``: max_running_requests x (context_len + 4) int32 slots, and the
   allocator's free list (one int64 per token);
5. the attention backend's workspace, then the CUDA graphs of the decode batch sizes;
6. at serve time the activations of one chunked-prefill forward.

Steps 4-6 live in the reserve ``P x (1 - mem_fraction_static)``; when they exceed it SGLang runs out of
memory after start. The radix (prefix) cache has no memory of its own: cached prefixes are pool tokens.
Without a GPU capacity the pool is sized for the batch (``batch x (seq + new_tokens)`` tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes, kv_bytes_per_element
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.results.estimate import Component, Estimate, GpuShare, Phase, tp_ranks
from gpumem_gui.core.runtimes import refusals
from gpumem_gui.core.runtimes.base import Lever, Runtime, load_phase, server_weights_refusal
from gpumem_gui.core.runtimes.cross_attention import with_encoder_tokens
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.sglang_command import SGLANG_ONLINE_QUANT, sglang_command
from gpumem_gui.core.runtimes.sglang_configurator import configurator
from gpumem_gui.core.runtimes.sglang_defaults import ServerDefaults, server_defaults
from gpumem_gui.core.runtimes.sglang_mm import vlm_fraction_factor
from gpumem_gui.core.runtimes.sglang_mm import warnings as mm_warnings
from gpumem_gui.core.runtimes.sglang_pool import (
    Pool,
    StageMemory,
    activation,
    dynamic_components,
)
from gpumem_gui.core.runtimes.sglang_state import (
    SGLANG_STATE_MIXERS,
    check_state_tp,
    ssm_dtype,
    staged_state,
    state_levers,
    state_warnings,
)
from gpumem_gui.core.runtimes.sglang_swa import Cells, swa_layers, swa_window
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, stage_layers
from gpumem_gui.core.spec.state import has_state


def _stage_ranges(spec: ModelSpec, run: InferenceRun) -> list[range]:
    """Each pipeline stage's layers as SGLang cuts them (distributed/utils.py get_pp_indices: the last
    ``layers % pp`` stages take one layer more)."""
    return [stage_layers(spec, run.pp, s, "last") for s in range(run.pp)]


def _stage(
    spec: ModelSpec, run: InferenceRun, wb: WeightBytes, stage: int, quantize_experts: bool
) -> tuple[Component, int, Cells]:
    """(weights component, layers, KV cells) of one pipeline stage's TP rank."""
    layers = _stage_ranges(spec, run)[stage]
    degrees = Degrees(tp=run.tp, pp=run.pp, ep=run.ep, remainder="last")  # as _stage_ranges
    weights, _ = load_phase(spec, run, quantize_experts, degrees, stage, wb)
    kv_elem = kv_bytes_per_element(run.kv_dtype_resolved)
    return weights, len(layers), configurator(spec).cells(spec, kv_elem, _attn_tp(run), layers)


def _attn_tp(run: InferenceRun) -> int:
    return run.tp // run.dp_size if run.enable_dp_attention else run.tp


def _warnings(spec: ModelSpec, run: InferenceRun, pool: Pool, dyn: int, context_len: int) -> list[str]:
    out: list[str] = state_warnings(run, pool.mamba)
    no_state = pool.mamba is not None and pool.mamba.slots <= 0  # refused by the state pool (its warning)
    if pool.capacity and pool.tokens <= 0 and not no_state and pool.fraction <= 0:
        out.append(
            f'mem_fraction_static: SGLang would refuse to start ("Not enough memory"): its default for this '
            f"GPU comes out at {pool.fraction:g}, the reserve it keeps for activations and CUDA graphs "
            "being larger than the GPU (lower chunked_prefill_size or cuda_graph_max_bs, or set "
            "mem_fraction_static)"
        )
    elif pool.capacity and pool.tokens <= 0 and not no_state:
        out.append(
            f'mem_fraction_static: SGLang would refuse to start ("Not enough memory"): the weights take more '
            f"than {pool.fraction:g} of the free memory, leaving no KV pool; raise mem_fraction_static"
        )
    elif pool.capacity and dyn > pool.reserve:
        out.append(
            f"mem_fraction_static: the reserve, (1 - {pool.fraction:g}) x free memory = "
            f"{pool.reserve / 2**30:.2f} GiB, is smaller than what SGLang allocates outside it (request "
            "pool, "
            f"attention workspace, CUDA graphs, prefill activations: {dyn / 2**30:.2f} GiB): expect an "
            "out-of-memory error at graph capture or the first long prefill; lower mem_fraction_static or "
            "chunked_prefill_size"
        )
    if pool.capacity and 0 < pool.tokens < run.tokens:
        out.append(
            f"seq: a request of {run.tokens} tokens exceeds the KV pool's {pool.tokens} tokens; SGLang "
            "rejects it"
        )
    if context_len > spec.max_position_embeddings:
        out.append(
            f"max_model_len: SGLang refuses a context length ({context_len}) above the model's "
            f"max_position_embeddings ({spec.max_position_embeddings}) unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
        )
    if run.dp_size > 1 and not run.enable_dp_attention:
        out.append(
            f"dp_size: {run.dp_size} replicas of tp x pp = {run.gpus} GPUs ({run.dp_size * run.gpus} GPUs in "
            "all); the estimate is one replica's GPUs, the batch spread over the replicas"
        )
    window = swa_window(spec)
    if pool.swa_tokens is not None and pool.tokens > 0 and pool.swa_tokens <= window + pool.page:
        out.append(
            f"swa_full_tokens_ratio: SGLang refuses to start: its SWA pool ({pool.swa_tokens} tokens) cannot "
            f"hold one request's window ({window} + page {pool.page}); raise "
            "swa_full_tokens_ratio or the memory"
        )
    cap = run.max_total_tokens
    if pool.capacity and cap is not None and pool.profiled is None and cap > pool.tokens > 0:
        out.append(
            f"max_total_tokens: {cap} is more than the {pool.tokens} tokens the memory "
            "gives; SGLang warns and keeps its own value"
        )
    return out


def _swa_facts(spec: ModelSpec, run: InferenceRun, pool: Pool) -> dict[str, object]:
    """How SGLang keeps the sliding-window (or chunked) layers' KV (absent for a model without them)."""
    if not swa_layers(spec):
        return {}
    if pool.swa_tokens is None:
        return {
            "swa_pool": "none: SGLang keeps every token's KV in the sliding layers too (the model is not on "
            "its hybrid-SWA list, model_config.py is_hybrid_swa_model)"
        }
    return {
        "swa_pool": f"separate: {pool.swa_tokens} tokens = int(max_total_num_tokens x "
        f"{run.swa_full_tokens_ratio:g}) in whole pages ({configurator(spec).swa_source})",
        "swa_full_tokens_ratio": run.swa_full_tokens_ratio,
    }


class Sglang(Runtime):
    name = "sglang"
    compressed_attention = True  # DeepSeek-V4: DeepSeekV4TokenToKVPool (runtimes/sglang_dsv4.py)
    label = "SGLang"
    sizes_from_capacity = True
    state_mixers = SGLANG_STATE_MIXERS  # the mamba pool (runtimes/sglang_state.py)
    state_tp = True  # the state is sharded by attention TP (Mamba2StateShape.create)

    state_refusals = refusals.SGLANG_STATE  # Mamba-1 (Jamba), lightning (MiniMax-Text-01)
    # Llama 3.2 Vision: its vision tokens take pool slots (cross_attention.with_encoder_tokens); the pool
    # counts every decoder layer, the cross-attention ones too (stage_cells: num_hidden_layers)
    cross_attention_cache = True

    def check(self, spec: ModelSpec, run: InferenceRun) -> list[str]:
        pools = configurator(spec)  # the model's pool configurator (sglang_configurator.py)
        warnings = pools.check(spec, run)  # what its path takes (DeepSeek-V4's: sglang_dsv4.py)
        run = pools.server_run(spec, run)
        if run.enable_dp_attention and (run.dp_size < 2 or run.tp % run.dp_size):
            raise GpumemInputError(
                f"DP attention needs dp_size (now {run.dp_size}) of at least 2 dividing tp ({run.tp})",
                field="dp_size",
            )
        if has_state(spec):  # after the check above: the attention TP is tp / dp_size, at least 1
            check_state_tp(spec, _attn_tp(run))
        kv = run.kv_dtype_resolved
        if kv not in ("bf16", "fp8_e4m3", "fp8_e5m2", run.compute_dtype):
            raise GpumemInputError(
                "SGLang stores the KV cache as auto (the compute dtype), bf16, fp8_e4m3 or fp8_e5m2, not "
                f"{kv!r} with compute dtype {run.compute_dtype}",
                field="kv_dtype",
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
        # SGLang picks its GPU-size defaults from nvidia-smi's total (server_args.py
        # get_device_memory_capacity runs nvidia-smi --query-gpu=memory.total) and sizes its pool from the
        # free memory torch reports before loading (model_runner.py get_available_gpu_memory:
        # torch.cuda.mem_get_info()[0]), i.e. from CUDA's total less the CUDA context
        run = with_encoder_tokens(spec, run)  # Llama 3.2 Vision: each request's vision tokens in the pool
        pools = configurator(spec)  # the model's pool configurator (sglang_configurator.py)
        run = pools.server_run(spec, run)  # the server defaults its path imposes (DeepSeek-V4's)
        # a multimodal model: SGLang's default fraction lowered for its vision tower (runtimes/sglang_mm.py)
        sd = server_defaults(run, gpu.driver_bytes if gpu else None, vlm_fraction_factor(spec) or 1.0)
        capacity = gpu.cuda_bytes if gpu else None
        context_len = run.max_model_len or spec.max_position_embeddings
        stages = [_stage(spec, run, wb, s, self.quantizes_experts(run)) for s in range(run.pp)]
        ranges = _stage_ranges(spec, run)  # a stage's state: the state layers of its own slice
        state = staged_state(spec, _attn_tp(run), ssm_dtype(run), ranges) if has_state(spec) else None
        weighed = [(w.bytes, c) for w, _, c in stages]
        pool = pools.size_pool(spec, run, capacity, sd, weighed, context_len, state)
        act = activation(spec, run, sd.chunked_prefill_size, pool.max_running_requests)
        shares, per_stage = [], []
        for s, (weights, layers, cells) in enumerate(stages):
            own = state.stages[s] if state is not None else None
            mem = pools.stage_memory(
                spec, run, dynamic_components(run, pool, sd, cells, layers, context_len, own), pool
            )
            per_stage.append(mem)
            shares.append(self._share(s, weights, mem, act))
        worst = max(range(run.pp), key=lambda s: shares[s].total_bytes)
        dyn = per_stage[worst].dynamic_bytes + act.bytes
        warnings = (
            *warnings,
            *_warnings(spec, run, pool, dyn, context_len),
            *mm_warnings(spec, sd.fraction_is_default),
        )
        result = self._result(run, sd, pool, shares, worst, stages[worst], per_stage[worst], act, warnings)
        # a sliding layer keeps at most the window of each sequence once SGLang evicts the older tokens
        seqs = ceil(run.batch / run.dp_size)
        swa_need = seqs * min(run.tokens, swa_window(spec))
        # a sequence: its KV and its state (on the stage shown)
        state_need = seqs * state.stages[worst].per_req if state is not None else 0
        return result.model_copy(
            update={
                "facts": {**result.facts, **_swa_facts(spec, run, pool)},
                "kv_cache_bytes": result.kv_cache_bytes + swa_need * stages[worst][2].swa + state_need,
            }
        )

    def _share(self, s: int, weights: Component, mem: StageMemory, act: Component) -> GpuShare:
        state = (mem.state,) if mem.state is not None else ()
        comps = (mem.preload, weights, mem.kv, *state, mem.req_pool, mem.workspace, mem.graphs, act)
        peak = weights.bytes + mem.kv.bytes + sum(c.bytes for c in state) + mem.req_pool.bytes + act.bytes
        total = peak + mem.preload.bytes + mem.workspace.bytes + mem.graphs.bytes
        return GpuShare(
            index=s, role=f"TP rank 0, PP stage {s}", peak_bytes=peak, total_bytes=total, components=comps
        )

    def _result(
        self,
        run: InferenceRun,
        sd: ServerDefaults,
        pool: Pool,
        shares: list[GpuShare],
        worst: int,
        stage: tuple[Component, int, Cells],
        mem: StageMemory,
        act: Component,
        warnings: tuple[str, ...],
    ) -> Estimate:
        weights, _, cells = stage
        share = shares[worst]
        static = (weights, mem.kv, *((mem.state,) if mem.state is not None else ()), mem.req_pool)
        phases = {
            "load": Phase(name="load", peak_bytes=weights.bytes, components=(weights,)),
            "pool": Phase(name="pool", peak_bytes=sum(c.bytes for c in static), components=static),
            "serve": Phase(
                name="serve",
                peak_bytes=share.peak_bytes,
                components=(*static, act),
                note="the KV, state and request pools are allocated at start; a chunked-prefill forward "
                "adds its activations",
            ),
        }
        seqs = ceil(run.batch / run.dp_size)
        need_tokens = seqs * run.tokens
        facts = {
            **pool.facts(),
            "chunked_prefill_size": sd.chunked_prefill_size,
            "cuda_graph_max_bs": sd.cuda_graph_max_bs,
            "cuda_graph_batch_sizes": len(sd.capture_sizes),
            "kv_bytes_per_token": cells.total,
            "kv_tokens_needed": need_tokens,
            "sequences_per_pool": seqs,
            "radix_cache": "off"
            if run.disable_radix_cache
            else "on (shares the KV pool; no memory of its own)",
        }
        if pool.capacity:  # whole requests of this run the server holds at once, over its dp pools
            facts["kv_pool_bytes"] = mem.kv.bytes
            facts["max_concurrency"] = min(pool.max_running_requests, pool.tokens // run.tokens) * run.dp_size
        return Estimate(
            mode="inference",
            engine=self.name,
            phases=phases,
            peak_phase="serve",
            peak_bytes=share.peak_bytes,
            total_bytes=share.total_bytes,
            components=share.components,
            per_gpu=tp_ranks(shares, run.tp),
            kv_cache_bytes=need_tokens * cells.full,
            warnings=warnings,
            facts=facts,
        )

    def admits(self, est: Estimate) -> bool:
        """SGLang starts with a positive pool; the batch runs at once if its tokens fit in the pool and its
        sequences within max_running_requests."""
        f = est.facts
        tokens = int(f.get("max_total_num_tokens", 0))  # type: ignore[call-overload]
        if "pre_load_free_bytes" not in f:
            return True
        seqs = int(f.get("sequences_per_pool", 1))  # type: ignore[call-overload]
        running = int(f.get("max_running_requests", 0))  # type: ignore[call-overload]
        return tokens > 0 and int(f.get("kv_tokens_needed", 0)) <= tokens and seqs <= running  # type: ignore[call-overload]

    def max_concurrency(self, est: Estimate) -> float | None:
        value = est.facts.get("max_concurrency")
        return None if value is None else float(value)  # type: ignore[arg-type]

    def fit_levers(self, spec: ModelSpec, run: InferenceRun, fits: Callable[..., bool]) -> list[Lever]:
        """For a run that does not fit: the highest mem_fraction_static that fits, a smaller prefill chunk,
        no CUDA graphs."""
        out: list[Lever] = []
        if fits():
            return out
        for f in (x / 100 for x in range(95, 29, -1)):
            if f != run.mem_fraction_static and fits(mem_fraction_static=f):
                out.append(
                    (1, "mem_fraction_static", f"mem_fraction_static {f:.2f}", {"mem_fraction_static": f})
                )
                break
        chunk = run.chunked_prefill_size or 8192
        while chunk > 256:
            chunk //= 2
            if fits(chunked_prefill_size=chunk):
                desc = f"chunked prefill of {chunk} tokens"
                out.append((2, "chunked_prefill_size", desc, {"chunked_prefill_size": chunk}))
                break
        if not run.disable_cuda_graph and fits(disable_cuda_graph=True):
            out.append(
                (
                    3,
                    "disable_cuda_graph",
                    "no CUDA graphs (--disable-cuda-graph)",
                    {"disable_cuda_graph": True},
                )
            )
        return out + (state_levers(run, fits) if has_state(spec) else [])

    # the run fields SGLang's launch_server has no option for (Runtime.unexpressed)
    unexpressed = (
        ("batch", "the requests sent to the server"),
        ("seq", "the requests' prompt tokens"),
        ("new_tokens", "the requests' new tokens"),
        ("cuda_context_mib", "the driver's CUDA context"),
    )

    def expresses(
        self, spec: ModelSpec, run: InferenceRun, source: str, checkpoint: str | None = None
    ) -> str | None:
        return super().expresses(spec, run, source, checkpoint) or server_weights_refusal(
            "SGLang", run, checkpoint, SGLANG_ONLINE_QUANT
        )

    def command(self, model: str, run: InferenceRun, est: Estimate) -> str:
        return self.with_unsaid(run, sglang_command(model, run))


SGLANG = Sglang()
