"""SGLang's pools, per GPU: the token-to-KV pool sized from the static memory fraction, the request pool, the
allocator, and what lives in the reserve (attention workspace, CUDA graphs, prefill activations).

Formulas follow ``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`` /
``mem_cache/kv_cache_configurator.py`` (``_profile_available_bytes``, ``_resolve_max_num_reqs``,
``_init_pools``) and ``mem_cache/memory_pool.py`` (``ReqToTokenPool``, ``MHATokenToKVPool``,
``MLATokenToKVPool``); the measured constants name the published logs behind them
(``validation/data/engine_logs/sglang.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.sglang_defaults import ServerDefaults
from gpumem_gui.core.runtimes.sglang_state import (
    MambaSlots,
    StagedState,
    StateBytes,
    mamba_slots,
    state_component,
)
from gpumem_gui.core.runtimes.sglang_swa import Cells, per_layer_bytes, split_tokens
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB, MiB

# Memory taken before the weights load on one GPU (CUDA context, caching allocator): CUDA's total (what
# SGLang's torch.cuda.mem_get_info reads; gpus.json cuda_memory_bytes, 79.19 GiB on H100 80GB) minus "Load
# weight begin. avail mem=" at tp 1 in published SGLang logs, median of 0.38, 0.60 and 0.76 GiB on H100 80GB
# (sglang.json key "constants.preload").
SGLANG_PRELOAD_BYTES = round(0.60 * GiB)
# What distributed init adds per tensor-parallel peer ("Init torch distributed ends. mem usage="): NCCL
# communicators and the custom all-reduce buffers over NVLink, 2.01 GB at tp 8 on H200 (sglang PR #11716);
# NCCL alone over PCIe (custom all-reduce off), 0.13 GB at tp 4 on L4 (sglang.json "constants.distributed").
SGLANG_DIST_BYTES_PER_PEER = {"nvlink": round(2.01 / 7 * GiB), "pcie": round(0.13 / 3 * GiB)}
# tp_link "auto": NVLink for GPUs of 70 GiB or more (the SXM / NVSwitch parts), PCIe below (as vLLM's profile)
NVLINK_GPU_BYTES = 70 * GiB
# The attention backend's workspace, allocated after the pools: "Memory pool end. avail mem=" minus "Capture
# cuda graph begin ... avail mem=", median of 0.09 (sglang PR #4760), 0.10 (docs.sglang.io LoRA page) and 0.64
# GiB (llms-in-clouds, tp 4 on L4) (sglang.json "constants.workspace").
SGLANG_WORKSPACE_BYTES = round(0.10 * GiB)
# CUDA-graph memory per captured batch size and decoder layer (each graph's kernel nodes; the activations
# share one pool): "Capture cuda graph end ... mem usage=" / (captured sizes x layers), median of 1.145, 0.640
# and 0.616 MiB (sglang.json "constants.cuda_graph").
SGLANG_GRAPH_BYTES_PER_SIZE_LAYER = round(0.64 * MiB)
# ReqToTokenPool rows hold context_len + 4 int32 slots (model_runner_kv_cache_mixin.py _init_pools:
# extra_max_context_len = 4 without speculative decoding).
REQ_TO_TOKEN_EXTRA = 4
INT32, INT64 = 4, 8
PAGE_SIZE = 1  # --page-size default for the FlashInfer / Triton / FA3 backends (server_args.py)
# max_running_requests when not set: int(tokens / context_len x 512), clamped to [2048, 4096], at most half
# the pool's tokens (_resolve_max_num_reqs)
_REQS_PER_CONTEXT, _REQS_MIN, _REQS_MAX = 512, 2048, 4096


def tp_link(run: InferenceRun, capacity: int | None) -> str:
    """The TP interconnect: the run's ``tp_link``, or by GPU size when ``auto`` (no peers: ``none``)."""
    if run.tp == 1:
        return "none"
    if run.tp_link != "auto":
        return run.tp_link
    return "nvlink" if capacity is not None and capacity >= NVLINK_GPU_BYTES else "pcie"


def preload_bytes(run: InferenceRun, capacity: int | None) -> int:
    """Memory in use when the weights start loading: the CUDA context, and the communicators per TP peer."""
    return SGLANG_PRELOAD_BYTES + (run.tp - 1) * SGLANG_DIST_BYTES_PER_PEER.get(tp_link(run, capacity), 0)


def cell_bytes(spec: ModelSpec, kv_elem: float, attn_tp: int, layers: int) -> int:
    """KV bytes one token costs on one rank over ``layers`` layers, all sized as full attention
    (:func:`~gpumem_gui.core.runtimes.sglang_swa.per_layer_bytes` x layers)."""
    return round(layers * per_layer_bytes(spec, kv_elem, attn_tp))


@dataclass(frozen=True)
class Pool:
    """The token pool every rank of the server shares the size of (the minimum over pipeline stages)."""

    capacity: int | None
    fraction: float
    pre_load_free: int  # P: free memory when the weights start loading
    reserve: int  # P x (1 - fraction)
    tokens: int  # max_total_num_tokens
    max_running_requests: int  # per pool (per DP-attention rank)
    explain: str
    page: int = PAGE_SIZE  # --page-size
    swa_tokens: int | None = None  # the hybrid SWA pool's tokens (None: no separate SWA pool)
    profiled: int | None = None  # tokens the memory gives before --max-total-tokens caps them
    mamba: MambaSlots | None = None  # a hybrid model's recurrent-state pool (sglang_state.py)

    def facts(self) -> dict[str, object]:
        out: dict[str, object] = {
            "max_total_num_tokens": self.tokens,
            "max_running_requests": self.max_running_requests,
            "mem_fraction_static": self.fraction,
            "mem_fraction_static_from": self.explain,
            "page_size": self.page,
        }
        if self.swa_tokens is not None:
            out["swa_max_total_num_tokens"] = self.swa_tokens
        if self.profiled is not None:
            out["tokens_before_max_total_tokens"] = self.profiled
        if self.capacity:
            out |= {"pre_load_free_bytes": self.pre_load_free, "reserve_bytes": self.reserve}
        if self.mamba is not None:
            out |= self.mamba.facts()
        return out


def max_requests(run: InferenceRun, tokens: int, context_len: int) -> int:
    """max_running_requests of one pool (``_resolve_max_num_reqs``); the run's value is per server and is
    divided over the DP-attention ranks."""
    estimated = max(min(int(tokens / context_len * _REQS_PER_CONTEXT), _REQS_MAX), _REQS_MIN)
    if run.max_running_requests is not None:
        return min(run.max_running_requests // (run.dp_size if run.enable_dp_attention else 1), estimated)
    return max(0, min(estimated, tokens // 2))


def size_pool(
    run: InferenceRun,
    capacity: int | None,
    sd: ServerDefaults,
    stages: list[tuple[int, Cells]],
    context_len: int,
    state: StagedState | None = None,
) -> Pool:
    """max_total_num_tokens from (weights bytes, KV cells) of each stage: ``(P x fraction - weights) //
    cell`` (hybrid SWA: cell = full + ratio x swa), the minimum over stages, capped by max_total_tokens,
    in whole pages; without a capacity, the cap or the batch's tokens. A hybrid state model (``state``): the
    state pool's (K + 1) x charged bytes come off the budget first, from the least ``rest`` of any stage
    (SGLang reads the free memory as the minimum over all ranks), and max_running_requests is at most
    tokens // 2 and K // slots per request (:mod:`.sglang_state`)."""
    f, page, ratio, cap = sd.mem_fraction_static, run.page_size or PAGE_SIZE, run.swa_full_tokens_ratio, None
    hybrid = any(c.swa for _, c in stages)
    mamba = None
    if not capacity:
        free = reserve = 0
        tokens = ceil((run.max_total_tokens or ceil(run.batch / run.dp_size) * run.tokens) / page) * page
        mamba = mamba_slots(run, None, state.fullest, state.charged) if state is not None else None
    else:
        free = max(0, capacity - preload_bytes(run, capacity))
        reserve = int(free * (1 - f))
        # _profile_available_bytes reads the free memory with get_available_gpu_memory(distributed=True),
        # an all-reduce MIN over the world: every stage sizes its pool from the least rest of any stage
        rest = min(free * f - w for w, _ in stages)
        if state is not None:  # _handle_max_mamba_cache returns rest - (K + 1) x charged per slot
            mamba = mamba_slots(run, rest, state.fullest, state.charged)
            rest -= mamba.budget_bytes
        # pool_configurator.py DefaultPoolConfigurator: a stage without KV layers while another stage has
        # some does not bound the pool (has_kv_on_another_pp_stage: int64 max, then the PP all-reduce MIN)
        per_stage = [int(rest // c.budget(ratio)) for _, c in stages if c.total] or [0]
        tokens = max(0, min(per_stage)) if mamba is None or mamba.slots > 0 else 0
        if run.max_total_tokens is not None and run.max_total_tokens < tokens:
            cap, tokens = tokens, run.max_total_tokens
    layers = Cells(
        full=sum(c.full for _, c in stages),
        swa=sum(c.swa for _, c in stages),
        full_layers=sum(c.full_layers for _, c in stages),
        swa_layers=sum(c.swa_layers for _, c in stages),
    )
    full, swa = split_tokens(tokens, layers, ratio, page)
    running = max_requests(run, full, context_len)
    if mamba is not None:  # resolve_max_num_reqs: min(..., tokens // 2, K // ratio)
        running = max(0, min(running, full // 2, mamba.slots // mamba.ratio))
    return Pool(
        capacity,
        f,
        free,
        reserve,
        full,
        running,
        sd.explain(),
        page,
        swa if hybrid else None,
        cap,
        mamba,
    )


@dataclass(frozen=True)
class StageMemory:
    """One rank's memory besides the weights and the activations."""

    preload: Component
    kv: Component
    req_pool: Component
    workspace: Component
    graphs: Component
    state: Component | None = None  # a hybrid model's recurrent-state pool

    @property
    def dynamic_bytes(self) -> int:
        """What SGLang allocates after sizing the KV pool, out of the reserve (activations not included)."""
        return self.req_pool.bytes + self.workspace.bytes + self.graphs.bytes


def dynamic_components(
    run: InferenceRun,
    pool: Pool,
    sd: ServerDefaults,
    cells: Cells,
    layers: int,
    context_len: int,
    state: StateBytes | None = None,
) -> StageMemory:
    """One stage's memory besides its weights (``state``: what a slot of its own state layers holds)."""
    link = tp_link(run, pool.capacity)
    preload = component(
        "non_torch",
        "before loading (CUDA context, NCCL, all-reduce buffers)",
        preload_bytes(run, pool.capacity),
        "0.60 GiB + (tp - 1) x per-peer communicator memory (0.29 GiB over NVLink, 0.04 GiB over PCIe)",
        "published SGLang logs: 'Load weight begin. avail mem', 'Init torch distributed ends. mem usage' "
        "(validation/data/engine_logs/sglang.json constants)",
        tp=run.tp,
        link=link,
    )
    kv = _kv_component(pool, cells)
    reqs, swa_tokens = pool.max_running_requests, pool.swa_tokens or 0
    req_pool = component(
        "req_to_token",
        "request pool (req-to-token) and allocator",
        reqs * (context_len + REQ_TO_TOKEN_EXTRA) * INT32 + (pool.tokens + swa_tokens) * INT64,
        "max_running_requests x (context_len + 4) x 4 B (ReqToTokenPool) + max_total_num_tokens x 8 B "
        "(the allocator's free list)"
        + (" + SWA tokens x 8 B (the SWA pool's free list)" if swa_tokens else ""),
        "sglang memory_pool.py ReqToTokenPool; allocator.py TokenToKVPoolAllocator / allocator/swa.py",
        max_running_requests=reqs,
        context_len=context_len,
    )
    workspace = component(
        "workspace",
        "attention backend workspace",
        SGLANG_WORKSPACE_BYTES,
        "measured: 'Memory pool end' - 'Capture cuda graph begin' avail mem",
        "validation/data/engine_logs/sglang.json key workspace",
    )
    n_sizes = len(sd.capture_sizes)
    graphs = component(
        "cudagraph",
        "CUDA graphs",
        n_sizes * layers * SGLANG_GRAPH_BYTES_PER_SIZE_LAYER,
        "captured batch sizes x layers x 0.64 MiB (0 with --disable-cuda-graph)",
        "validation/data/engine_logs/sglang.json key cuda_graph; batch sizes: server_args.py "
        "_generate_cuda_graph_batch_sizes",
        batch_sizes=n_sizes,
        cuda_graph_max_bs=sd.cuda_graph_max_bs,
        layers=layers,
    )
    mamba = pool.mamba if pool.mamba is None or state is None else replace(pool.mamba, state=state)
    return StageMemory(preload, kv, req_pool, workspace, graphs, state_component(mamba) if mamba else None)


def _kv_component(pool: Pool, cells: Cells) -> Component:
    """The token-to-KV pool: (tokens + one page) rows of the full cell, and for a hybrid-SWA model (SWA
    tokens + one page) rows of the sliding layers' cell (SWAKVPool's two MHATokenToKVPools)."""
    if pool.capacity:
        budget = "cell" if pool.swa_tokens is None else "(full cell + swa_full_tokens_ratio x SWA cell)"
        how = (
            f"max_total_num_tokens = (P x mem_fraction_static - weights) // {budget} (min over pipeline "
            "stages, at most max_total_tokens), whole pages"
        )
    else:
        how = "max_total_num_tokens = max_total_tokens, or batch x (seq + new tokens), in whole pages"
    if pool.mamba is not None:  # the state pool's bytes come off the budget first (sglang_state.py)
        how = how.replace("- weights)", "- weights - state pool)") + "; attention layers only"
    if pool.swa_tokens is None:
        return component(
            "kv_cache",
            "KV pool (token-to-KV)",
            (pool.tokens + pool.page) * cells.full,
            f"(max_total_num_tokens + page) x cell; {how}",
            "sglang pool_configurator.py DefaultPoolConfigurator; memory_pool.py MHATokenToKVPool",
            max_total_num_tokens=pool.tokens,
            cell_bytes=cells.full,
            page_size=pool.page,
            mem_fraction_static=pool.fraction,
            pre_load_free_bytes=pool.pre_load_free,
        )
    return component(
        "kv_cache",
        "KV pools (full and sliding-window layers)",
        (pool.tokens + pool.page) * cells.full + (pool.swa_tokens + pool.page) * cells.swa,
        "(max_total_num_tokens + page) x full cell + (SWA tokens + page) x SWA cell; SWA tokens = "
        f"int(max_total_num_tokens x swa_full_tokens_ratio), whole pages; {how}",
        "sglang pool_configurator.py HybridSWAPoolConfigurator; swa_memory_pool.py SWAKVPool",
        max_total_num_tokens=pool.tokens,
        swa_tokens=pool.swa_tokens,
        full_cell_bytes=cells.full,
        swa_cell_bytes=cells.swa,
        full_layers=cells.full_layers,
        swa_layers=cells.swa_layers,
        page_size=pool.page,
        mem_fraction_static=pool.fraction,
        pre_load_free_bytes=pool.pre_load_free,
    )


def activation(spec: ModelSpec, run: InferenceRun, chunk: int, max_running: int) -> Component:
    """The peak of one chunked-prefill forward: ``chunk`` tokens through the widest layer, and the logits
    of the batch's last tokens in fp32 (SGLang computes logits only at each request's last position)."""
    tp, dt = run.tp, run.dt
    h = spec.hidden_size
    f = (
        spec.moe.expert_intermediate_size * spec.moe.experts_per_token
        + spec.moe.shared_expert_intermediate_size
        if spec.moe
        else spec.intermediate_size
    )
    qkv = spec.q_width + 2 * spec.kv_width
    per_token = 2 * h * dt + max(3 * f * dt // tp, (qkv + spec.q_width) * dt // tp)
    vocab = ceil(spec.vocab_size / tp)
    seqs = max(1, min(ceil(run.batch / run.dp_size), max_running or 1, chunk))
    return component(
        "activations",
        "chunked-prefill activations",
        chunk * per_token + seqs * vocab * (dt + 2 * 4),
        "chunk x (2h + max(3F, qkv + q) / tp) x dt + sequences x vocab / tp x (dt + 8): one prefill forward "
        "of chunked_prefill_size tokens and the last positions' logits/probs in fp32",
        "sglang server_args.py chunked_prefill_size; logits_processor.py (last positions only)",
        chunk=chunk,
        h=h,
        F=f,
        sequences=seqs,
        vocab=vocab,
    )
