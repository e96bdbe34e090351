"""SGLang's pools for DeepSeek-V4's compressed attention, at the byte (sglang main, the newest versions read:
``model_executor/pool_configurator.py`` ``DSV4PoolConfigurator`` and ``mem_cache/kv_cache_configurator.py``
``_build_dsv4_kv_pool`` at 003fca8, ``mem_cache/deepseek_v4_memory_pool.py`` ``DeepSeekV4TokenToKVPool`` at
007bddd, ``mem_cache/deepseek_v4_compress_state.py`` ``CompressStatePool`` at 067c8c8; the server defaults
of ``apply_deepseek_v4_defaults``). CUDA's fp8 layout only: not the ROCm unified KV, HiSparse, the
trtllm uniform-fp8 pool, speculative decoding's rings or ``SGLANG_OPT_USE_ONLINE_COMPRESS``.

SGLang forces ``--page-size 256``, an fp8_e4m3 KV cache when it is ``auto``, ``--max-running-requests 256``
and ``--swa-full-tokens-ratio 0.1`` when they are left unset. ``max_total_num_tokens`` (the "full" tokens)
is an index space: no layer keeps a full KV. From ``available`` = the static fraction's rest after the
weights, less the request-scoped ratio-128 compressor state ``(slots x 128 + 129, padded to 128) rows x 2
head_dim x 4 B`` per HCA layer (slots = max_running_requests + 1):

    full = int((available - c128 state) / bytes_per_full_token) // page x page
    bytes_per_full_token = r x 584 x layers + 584 / 4 x CSA + 584 / 128 x HCA + 132 / 4 x CSA
                           + r x 8 / window x (8192 + 2048) x CSA        (r = swa_full_tokens_ratio)

and then swa = int(full x r) in whole pages, CSA entries full / 4, HCA entries full / 128, the indexer keys
(full / 128) x 32 and the ratio-4 compressor states ``swa // window x 8`` rows per CSA layer (its two:
the attention's ``2 x 2 x head_dim`` and the indexer's ``2 x 2 x index_head_dim`` fp32 rows). The buffers:
the SWA pool ``(swa + page + 1) // page`` pages of every layer, each page ``page x 584`` B padded to 576
(``DeepSeekV4SingleKVPool.create_buffer``); the CSA / HCA pools the same with pages of ``page / ratio``
entries; the indexer ``page / 4`` entries of 132 B a page; each state ``size + ring + 1`` rows padded to
the ratio. ``--max-total-tokens`` below the profiled tokens recomputes the sizes from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.runtimes.sglang_defaults import ServerDefaults
from gpumem_gui.core.runtimes.sglang_pool import Pool, StageMemory, max_requests, preload_bytes
from gpumem_gui.core.runtimes.sglang_swa import Cells
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

# apply_deepseek_v4_defaults: page_size = 256 on CUDA (kv_cache_configurator.py _build_dsv4_kv_pool asserts
# it: "In paged swa mode, page_size must be 256."), max_running_requests 256 and swa_full_tokens_ratio 0.1
# when not given, kv_cache_dtype fp8_e4m3 when auto
PAGE, MAX_RUNNING, SWA_RATIO, KV_DTYPE = 256, 256, 0.1, "fp8_e4m3"
DEFAULT_SWA_RATIO = 0.8  # ServerArgs.swa_full_tokens_ratio: the value apply_deepseek_v4_defaults replaces
# DeepSeekV4SingleKVPool.get_bytes_per_token: qk_nope fp8 + qk_rope bf16 + nope // 64 scales + 1 pad (it
# asserts 448 + 64 x 2 + 8 = 584); create_buffer pads each page to a multiple of 576 B
ROPE_BYTES, QUANT_BLOCK, SCALE_PAD, ENTRY, ALIGN = 2, 64, 1, 584, 576
# get_dsv4_indexer_bytes_per_token (fp8 indexer): index_head_dim fp8 + one fp32 scale per 128
INDEXER_QUANT_BLOCK, INDEXER_SCALE = 128, 4
# DeepSeekV4TokenToKVPool.__init__: c4_logical_size = c128_size x 32 (the indexer pool's tokens)
INDEXER_PER_C128 = 32
# get_compress_state_ring_size without speculative decoding: 8 rows at ratio 4, 128 at ratio 128
RING = {4: 8, 128: 128}
# SGLANG_DSV4_COMPRESS_STATE_DTYPE default "float32" (_get_dsv4_compress_state_dtype_sizes)
STATE_BYTES = 4
_SRC = (
    "sglang main 003fca8 pool_configurator.py DSV4PoolConfigurator; 007bddd deepseek_v4_memory_pool.py "
    "DeepSeekV4TokenToKVPool; 067c8c8 deepseek_v4_compress_state.py CompressStatePool"
)


def _page_bytes(entries: int) -> int:
    """One page of ``entries`` 584-byte entries, padded to a multiple of 576 B (``create_buffer``)."""
    return ceil(entries * ENTRY / ALIGN) * ALIGN


@dataclass(frozen=True)
class Dsv4Shape:
    """What the configurator reads: the layers by compression ratio, the head split, the window."""

    layers: int
    csa: int
    hca: int
    nope: int
    rope: int
    index_dim: int
    window: int

    @property
    def head_dim(self) -> int:
        return self.nope + self.rope

    @property
    def entry(self) -> int:
        """Bytes of one cached entry (``get_bytes_per_token``)."""
        return self.nope + self.rope * ROPE_BYTES + self.nope // QUANT_BLOCK + SCALE_PAD

    @property
    def indexer_entry(self) -> int:
        return self.index_dim + self.index_dim // INDEXER_QUANT_BLOCK * INDEXER_SCALE

    def bytes_per_full_token(self, swa_ratio: float) -> float:
        """``_get_bytes_per_full_token``, its terms in its order (the float the log line prints)."""
        kv, idx, n4, n128 = self.entry, self.indexer_entry, self.csa, self.hca
        c4_state = 2 * 2 * self.head_dim * STATE_BYTES
        c4_indexer_state = 2 * 2 * self.index_dim * STATE_BYTES
        c4_state_ratio = RING[4] / self.window
        # the request-scoped c128 state is priced apart (c128_state_ratio = 0)
        return (
            swa_ratio * kv * self.layers
            + 1 / 4 * kv * n4
            + 1 / 128 * kv * n128
            + 1 / 4 * idx * n4
            + swa_ratio * c4_state_ratio * c4_state * n4
            + swa_ratio * c4_state_ratio * c4_indexer_state * n4
        )

    def c128_state_bytes(self, slots: int) -> int:
        """``_get_c128_state_fixed_bytes``: ``slots x 128 + 128 + 1`` rows padded to 128, ``2 x head_dim``
        fp32 each, per HCA layer (what ``CompressStatePool`` allocates for them)."""
        return _state_rows(slots * RING[128], 128) * 2 * self.head_dim * STATE_BYTES * self.hca


def _state_rows(size: int, ratio: int) -> int:
    """``CompressStatePool.__init__`` (CUDA, offline): ``size + ring + 1`` rows, padded to the ratio."""
    return ceil((size + RING[ratio] + 1) / ratio) * ratio


def shape(spec: ModelSpec) -> Dsv4Shape:
    at = model_kinds(spec).compressed
    assert at is not None
    rope = spec.rotary_dim or 0
    return Dsv4Shape(
        layers=len(at.layer_types),
        csa=at.layer_types.count("compressed_sparse_attention"),
        hca=at.layer_types.count("heavily_compressed_attention"),
        nope=at.head_dim - rope,
        rope=rope,
        index_dim=at.index_head_dim,
        window=at.sliding_window,
    )


@dataclass(frozen=True)
class Dsv4Sizes:
    """``_compute_dsv4_sizes`` plus the request-scoped c128 state (``finalize_with_max_running_requests``)."""

    full: int
    swa: int
    c4: int
    c128: int
    c4_state: int
    slots: int  # num_req_slots: max_running_requests + 1

    @property
    def c128_state(self) -> int:
        return self.slots * RING[128]


def sizes(sh: Dsv4Shape, full: int, ratio: float, page: int, slots: int) -> Dsv4Sizes:
    full = full // page * page
    swa = int(full * ratio) // page * page
    c4_state = swa // sh.window * RING[4]
    return Dsv4Sizes(full, swa, full // 4, full // 128, c4_state, slots)


def buffers(sh: Dsv4Shape, s: Dsv4Sizes, page: int) -> dict[str, int]:
    """Bytes of each buffer ``DeepSeekV4TokenToKVPool`` allocates (CUDA, fp8, no unified KV)."""

    def pages(size: int, page_size: int) -> int:  # (size + page + 1) // page: the padding page and slot 0
        return (size + page_size + 1) // page_size

    c4_page, c128_page = page // 4, page // 128
    indexer = s.c128 * INDEXER_PER_C128
    state_row = 2 * 2 * (sh.head_dim + sh.index_dim) * STATE_BYTES  # the attention's and the indexer's
    return {
        "swa": sh.layers * pages(s.swa, page) * _page_bytes(page),
        "csa": sh.csa * pages(s.c4, c4_page) * _page_bytes(c4_page),
        "hca": sh.hca * pages(s.c128, c128_page) * _page_bytes(c128_page),
        "indexer": sh.csa * pages(indexer, c4_page) * c4_page * sh.indexer_entry,
        "csa_state": sh.csa * _state_rows(s.c4_state, 4) * state_row,
        "hca_state": sh.c128_state_bytes(s.slots),
    }


def dsv4_run(run: InferenceRun) -> InferenceRun:
    """The run with what ``apply_deepseek_v4_defaults`` sets (page 256, fp8_e4m3 for auto, 256 running
    requests and an SWA ratio of 0.1 when not given)."""
    ratio = SWA_RATIO if run.swa_full_tokens_ratio == DEFAULT_SWA_RATIO else run.swa_full_tokens_ratio
    return run.model_copy(
        update={
            "page_size": PAGE,
            "kv_dtype": KV_DTYPE if run.kv_dtype == "auto" else run.kv_dtype,
            "max_running_requests": run.max_running_requests or MAX_RUNNING,
            "swa_full_tokens_ratio": ratio,
        }
    )


def check(spec: ModelSpec, run: InferenceRun) -> list[str]:
    """What SGLang's DeepSeek-V4 path takes (one-line errors) and the defaults it imposes (warnings)."""
    at = model_kinds(spec).compressed
    assert at is not None
    sh = shape(spec)
    if (at.csa_rate, at.hca_rate) != tuple(RING) or sh.entry != ENTRY:
        raise GpumemInputError(
            f"sglang: compress rates {at.csa_rate} / {at.hca_rate} and {sh.entry} B entries: SGLang's "
            "DeepSeek-V4 pool takes rates 4 and 128 (get_compress_state_ring_size) and 584 B entries "
            "(DeepSeekV4SingleKVPool asserts them)",
            field="model",
        )
    if run.pp > 1:
        raise GpumemInputError(
            "sglang: DeepSeek-V4 over pipeline stages is not modelled (each stage's pool slice); use --pp 1",
            field="pp",
        )
    if run.kv_dtype not in ("auto", KV_DTYPE):
        raise GpumemInputError(
            f"kv_dtype: SGLang's CUDA DeepSeek-V4 pool stores fp8_e4m3 only (DeepSeekV4SingleKVPool asserts "
            f"uint8 storage; bfloat16 is its NPU layout), not {run.kv_dtype}",
            field="kv_dtype",
        )
    out = []
    if run.kv_dtype == "auto":
        out.append(
            f"sglang: SGLang sets --kv-cache-dtype {KV_DTYPE} for DeepSeek-V4 when it is auto "
            f"(apply_deepseek_v4_defaults): sized with {KV_DTYPE}"
        )
    if run.page_size not in (None, PAGE):
        out.append(
            f"page_size: SGLang sets --page-size {PAGE} for DeepSeek-V4 whatever is given "
            "(apply_deepseek_v4_defaults); sized with 256"
        )
    return out


def cells(spec: ModelSpec) -> Cells:
    """Per-token bytes for the batch's need: the compressed entries and indexer keys every token adds
    (``full``) and the window every layer keeps (``swa``)."""
    sh = shape(spec)
    grow = ENTRY / 4 * sh.csa + ENTRY / 128 * sh.hca + sh.indexer_entry / 4 * sh.csa
    return Cells(full=round(grow), swa=ENTRY * sh.layers, full_layers=sh.layers, swa_layers=sh.layers)


def size_pool(
    spec: ModelSpec,
    run: InferenceRun,
    capacity: int | None,
    sd: ServerDefaults,
    weights: int,
    context_len: int,
) -> Pool:
    """``DSV4PoolConfigurator.calculate_pool_sizes`` (then ``--max-total-tokens`` and
    ``_resolve_max_num_reqs``) on one rank of a DSV4 ``run`` (:func:`dsv4_run` applied)."""
    sh, f, page, ratio = shape(spec), sd.mem_fraction_static, PAGE, run.swa_full_tokens_ratio
    dp = run.dp_size if run.enable_dp_attention else 1
    requested = (run.max_running_requests or MAX_RUNNING) // dp
    cap = profiled = None
    if not capacity:
        free = reserve = 0
        full = ceil((run.max_total_tokens or ceil(run.batch / run.dp_size) * run.tokens) / page) * page
    else:
        free = max(0, capacity - preload_bytes(run, capacity))
        reserve = int(free * (1 - f))
        available = int(free * f - weights)
        usable = max(available - sh.c128_state_bytes(requested + 1), 0)
        full = int(usable / sh.bytes_per_full_token(ratio)) // page * page
        cap = run.max_total_tokens
        if cap is not None and full > cap:  # calculate_pool_sizes_from_max_tokens
            profiled, full = full, cap // page * page
    running = max_requests(run, full, context_len)
    s = sizes(sh, full, ratio, page, running + 1)
    return Pool(capacity, f, free, reserve, s.full, running, sd.explain(), page, s.swa, profiled)


def with_pools(spec: ModelSpec, run: InferenceRun, mem: StageMemory, pool: Pool) -> StageMemory:
    """The stage's memory with the DeepSeek-V4 pools as its KV component."""
    return replace(mem, kv=kv_component(spec, run, pool))


def kv_component(spec: ModelSpec, run: InferenceRun, pool: Pool) -> Component:
    """The pools ``DeepSeekV4TokenToKVPool`` allocates for ``pool`` (its sizes from the same rule)."""
    sh, ratio = shape(spec), run.swa_full_tokens_ratio
    s = sizes(sh, pool.tokens, ratio, pool.page, pool.max_running_requests + 1)
    parts = buffers(sh, s, pool.page)
    how = (
        "full = (P x mem_fraction_static - weights - c128 state) / bytes_per_full_token, whole pages"
        if pool.capacity
        else "full = max_total_tokens, or batch x (seq + new tokens), in whole pages"
    )
    return component(
        "kv_cache",
        "KV pools (DeepSeek-V4: SWA ring, CSA / HCA entries, indexer keys, compressor states)",
        sum(parts.values()),
        f"{how}; SWA = int(full x ratio) pages of every layer (page x 584 B padded to 576), CSA / HCA "
        "entries full / 4 and full / 128, indexer keys (full / 128) x 32 x 132 B, ratio-4 states "
        "swa / window x 8 rows, ratio-128 states (max_running_requests + 1) x 128 rows",
        _SRC,
        full_tokens=s.full,
        swa_tokens=s.swa,
        c4_tokens=s.c4,
        c128_tokens=s.c128,
        c4_state_rows=s.c4_state,
        c128_state_rows=s.c128_state,
        bytes_per_full_token=round(sh.bytes_per_full_token(ratio), 2),
        **{f"{k}_bytes": v for k, v in parts.items()},
    )
