"""vLLM's cache for DeepSeek-V4's compressed attention (``vllm/models/deepseek_v4``; v0.27.1 is the version
read), at the byte.

Every layer reports its caches to the KV manager (``get_kv_cache_spec``), all with one KV head (replicated on
every TP rank) and FlashMLA's ``fp8_ds_mla`` layout (584-byte entries, pages padded to a multiple of 576):

* each layer's sliding window (``DeepseekV4SWACache``: ``SlidingWindowMLASpec``, 64-token blocks, the
  config's window);
* each CSA / HCA layer's compressed entries (``DeepseekV4Attention``: ``MLAAttentionSpec`` with
  ``compress_ratio``: ``block_size // ratio`` entries per page of ``block_size`` tokens);
* each CSA layer's indexer keys (``DeepseekV4IndexerCache``: ``MLAAttentionSpec``, 132-byte fp8 entries: 128
  fp8 values and one fp32 scale; 68 bytes with ``--attention_config.use_fp4_indexer_cache``);
* each compressor's running state (``CompressorStateCache``: ``SlidingWindowMLASpec`` of fp32 rows of
  ``2 x coff x head_dim``; blocks of 4 tokens and window 8 at ratio 4, where coff = 2 (the overlapping
  windows), blocks of 8 and window 128 at ratio 128), one for the attention's compressor and, on CSA
  layers, one for the indexer's.

``vllm/v1/core/kv_cache_utils.py``: ``group_and_unify_kv_cache_specs`` puts the specs in four buckets (every
``MLAAttentionSpec``; the ``SlidingWindowMLASpec`` by ``(block_size, sliding_window)``), each bucket a number
of *layer tuples* (the layers of its most frequent page size); ``_get_kv_cache_groups_uniform_groups`` picks
the tuple count ``d`` that pads the buckets least (``_approximate_gcd``, from the MLA bucket's count up, the
larger ``d`` on a tie) and splits a bucket of more tuples into ``ceil(n / d)`` groups.
``_get_kv_cache_config_packed``: every group lays its layers' pages from offset 0 of one block, the block
stride is the fullest group's sum, ``num_blocks = available // stride``, and the groups draw block ids from
that one pool. ``get_max_concurrency_for_kv_cache_config``: a request takes, in every group,
``cdiv(max_memory_usage_bytes, page_size_bytes)`` blocks (``cdiv(max_model_len, block_size)`` in the MLA
group; ``cdiv(min(window - 1 + in-flight tokens, max_model_len), block) + 1`` in a sliding group, the
in-flight tokens being ``max_concurrent_batches x max_num_batched_tokens``); ``get_kv_cache_capacity``: "GPU
KV cache size" is ``int(max_concurrency x max_model_len)``. The start-up check prices a block at ``d`` layer
tuples of the widest bucket (``_max_memory_usage_bytes_from_groups``, its DeepSeek-V4 branch).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import ceil

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.results.estimate import Component
from gpumem_gui.core.runtimes.base import component
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.compressed import CompressedAttentionSpec
from gpumem_gui.core.spec.kinds import Bound

# kv_cache_interface.py MLAAttentionSpec / SlidingWindowMLASpec.real_page_size_bytes (model_version
# "deepseek_v4", fp8_ds_mla): 448 B fp8 NoPE + 128 B bf16 RoPE + 8 B scales per entry
ENTRY_BYTES = 584
# models/deepseek_v4/attention.py get_kv_cache_spec: alignment=576 (FlashMLA), applied by
# kv_cache_interface.py _apply_alignment_padding (the page rounded up to a multiple)
ALIGNMENT = 576
# v1/attention/backends/mla/sparse_swa.py DeepseekV4SWACache.__init__: self.block_size = 64
SWA_BLOCK = 64
# models/deepseek_v4/compressor.py CompressorStateCache.__init__: block_size 4 at ratio 4, 8 at ratio 128;
# the window coff x ratio (coff = 2 with the overlapping windows of ratio 4)
STATE_BLOCK = {4: 4, 128: 8}
STATE_BYTES = 4  # CompressorStateCache: assert self.dtype == torch.float32
# DeepseekV4Indexer.__init__: quant_block_size 128, one fp32 scale (4 B) per 128 fp8 values; MXFP4: two
# values per byte and one UE8M0 byte per 32 (MXFP4_BLOCK_SIZE)
INDEXER_QUANT_BLOCK, INDEXER_SCALE_BYTES, MXFP4_BLOCK = 128, 4, 32
# DeepseekSparseSWABackend.get_preferred_block_size: 256 (what vLLM takes when --block-size is not given; the
# DeepSeek-V4 recipes pass --block-size 256)
PREFERRED_BLOCK = 256
# gpumem's --block-size default (runtimes/vllm.py VLLM_BLOCK_SIZE): "not given" for DeepSeek-V4
UNSET_BLOCK = 16
# vllm/config/vllm.py max_concurrent_batches: 2 with async scheduling (the API server's default) at pp 1
IN_FLIGHT_BATCHES = 2
# layers/deepseek_v4_attention.py PREFILL_CHUNK_SIZE: the prefill gather workspace's requests, reserved in
# the profiling run as (4, cdiv(max_model_len, ratio) + window + max_num_batched_tokens, head_dim) bf16
PREFILL_CHUNK, WORKSPACE_BYTES = 4, 2


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Bucket:
    """One bucket of specs: its pages' block (tokens per block id), window (None: the MLA bucket, every
    block kept) and each layer's page bytes."""

    name: str
    block: int
    window: int | None
    pages: tuple[int, ...]

    @property
    def tuples(self) -> int:
        """Layer tuples: the layers of the most frequent page size (``get_num_layer_tuples``)."""
        return max(Counter(self.pages).values())

    @property
    def tuple_bytes(self) -> int:
        """One layer of each page size."""
        return sum(set(self.pages))

    def split(self, d: int) -> tuple[int, int]:
        """(groups, bytes of the fullest group's pages) once split into groups of ``d`` tuples."""
        n = ceil(self.tuples / d)
        return n, sum(ceil(c / n) * p for p, c in Counter(self.pages).items())

    def blocks(self, tokens: int, block: int, in_flight: int, held: bool = False) -> int:
        """Blocks one request of ``tokens`` tokens takes in one group of this bucket: vLLM's reservation
        (``max_memory_usage_bytes`` over the page), or with ``held`` what it can actually hold."""
        if self.window is None:  # MLAAttentionSpec (FullAttentionSpec.max_memory_usage_bytes)
            return ceil(tokens / block)
        own = ceil(tokens / self.block)
        bound = ceil(min(self.window - 1 + in_flight, tokens) / self.block) + 1  # SlidingWindowSpec
        return min(own, bound) if held else bound


def buckets(
    at: CompressedAttentionSpec, block: int, fp4_indexer: bool = False, mtp_layers: int = 0
) -> tuple[Bucket, ...]:
    """The four buckets of a DeepSeek-V4 model's caches at ``--block-size block`` (MLA first), with
    ``mtp_layers`` speculative MTP layers (each a sliding window only)."""
    d, di = at.head_dim, at.index_head_dim
    types = at.layer_types
    csa = types.count("compressed_sparse_attention")
    hca = types.count("heavily_compressed_attention")
    idx_entry = (
        di // 2 + di // MXFP4_BLOCK if fp4_indexer else di + di // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES
    )
    main = [_aligned(block // at.csa_rate * ENTRY_BYTES)] * csa + [
        _aligned(block // at.hca_rate * ENTRY_BYTES)
    ] * hca
    indexer = [_aligned(block // at.csa_rate * idx_entry)] * csa

    def state(rate: int, dim: int) -> int:  # 2 x coff x dim fp32 per token, STATE_BLOCK tokens a page
        coff = 2 if rate == at.csa_rate else 1
        return _aligned(STATE_BLOCK[rate] * 2 * coff * dim * STATE_BYTES)

    return (
        Bucket("compressed entries and indexer keys", block, None, tuple(main + indexer)),
        Bucket(
            "sliding window",
            SWA_BLOCK,
            at.sliding_window,
            (_aligned(SWA_BLOCK * ENTRY_BYTES),) * (len(types) + mtp_layers),
        ),
        Bucket(
            f"ratio-{at.csa_rate} compressor state",
            STATE_BLOCK[at.csa_rate],
            2 * at.csa_rate,
            (state(at.csa_rate, d),) * csa + (state(at.csa_rate, di),) * csa,
        ),
        Bucket(
            f"ratio-{at.hca_rate} compressor state",
            STATE_BLOCK[at.hca_rate],
            at.hca_rate,
            (state(at.hca_rate, d),) * hca,
        ),
    )


def approximate_gcd(counts: list[int], lower_bound: int) -> int:
    """kv_cache_utils.py ``_approximate_gcd``: the tuple count from ``lower_bound`` to the largest count that
    pads the buckets least (each rounded up to a multiple of it), the larger on a tie."""
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(counts) + 1):
        pad = sum(-(-c // d) * d - c for c in counts)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


@dataclass(frozen=True)
class Dsv4Layout:
    """The rank's DeepSeek-V4 pool as vLLM packs it: a :class:`.vllm_layout.PagedLayout`, so the vLLM
    estimate treats it as one more layout (``runtimes/vllm.py``)."""

    buckets: tuple[Bucket, ...]
    block: int  # --block-size: tokens per block of the MLA group
    max_len: int
    batched: int  # max_num_batched_tokens
    attention: CompressedAttentionSpec  # its prefill workspace's shape (profiled)
    tuples: int = field(init=False)  # d: layer tuples per group

    def __post_init__(self) -> None:
        counts = [b.tuples for b in self.buckets]
        object.__setattr__(self, "tuples", approximate_gcd(counts, counts[0]))

    @property
    def in_flight(self) -> int:
        return IN_FLIGHT_BATCHES * self.batched

    @property
    def group_size(self) -> int:
        return self.tuples

    @property
    def windows(self) -> tuple[Bound | None, ...]:
        """One entry per group: None for the MLA group, a sliding bound for the others."""
        out: list[Bound | None] = []
        for b in self.buckets:
            n, _ = b.split(self.tuples)
            out += [None if b.window is None else ("sliding", b.window)] * n
        return tuple(out)

    @property
    def groups(self) -> int:
        return len(self.windows)

    windowed = True  # every group takes blocks by its own rule

    @property
    def block_bytes(self) -> int:
        """The block stride: the fullest group's pages (``_get_packed_kv_cache_layout``)."""
        return max(b.split(self.tuples)[1] for b in self.buckets)

    @property
    def guard_block_bytes(self) -> int:
        """What vLLM's start-up check prices a block at: ``d`` layer tuples of the widest bucket."""
        return max(self.tuples * b.tuple_bytes for b in self.buckets)

    @property
    def per_token_bytes(self) -> int:
        """The pool's cost of one more token of context in the MLA group (its pages over the block); the
        window and the compressor state are bounded per request."""
        return round(sum(self.buckets[0].pages) / self.block)

    def blocks(self, pool: int) -> int:
        return pool // self.block_bytes

    def blocks_per_request(
        self, tokens: int, block_size: int, batched_tokens: int, held: bool = False
    ) -> int:
        """Blocks one request of ``tokens`` tokens takes, summed over the groups (``batched_tokens`` and
        ``block_size`` are the layout's own)."""
        total = 0
        for b in self.buckets:
            n, _ = b.split(self.tuples)
            total += n * b.blocks(tokens, self.block, self.in_flight, held)
        return total

    def reported_tokens(self, blocks: int, block_size: int) -> int:
        """ "GPU KV cache size": ``int(max_concurrency x max_model_len)`` (get_kv_cache_capacity)."""
        per_request = self.blocks_per_request(self.max_len, self.block, self.batched)
        return int(blocks / per_request * self.max_len) if per_request else 0

    def request_bytes(self, per_request: int) -> int:
        """vLLM's start-up check (``_check_enough_kv_cache_memory``): one ``max_model_len`` request priced at
        ``guard_block_bytes`` a block."""
        return per_request * self.guard_block_bytes

    def start_refusal(self, pool: int, per_request: int, max_len: int) -> str | None:
        """The warning when that request does not fit the pool."""
        need = self.request_bytes(per_request)
        if pool >= need:
            return None
        return (
            f"max_model_len: vLLM would refuse to start: one request of max_model_len {max_len} needs "
            f"{need / 2**30:.2f} GiB of KV cache ({per_request} blocks over {self.groups} groups at "
            f"{self.guard_block_bytes} B), more than the {pool / 2**30:.2f} GiB available; a shorter "
            "--max-model-len or --max-num-batched-tokens (the sliding groups reserve two batches of it) fits"
        )

    def pool_formula(self, block_size: int) -> str:
        return (
            f"in whole blocks of {self.block_bytes} B (the fullest of {self.groups} packed groups: the "
            f"compressed entries and indexer keys of {self.block}-token pages, the sliding windows, the "
            "compressor states)"
        )

    def profiled(self, activation: Component) -> Component:
        """The profiled peak plus the prefill gather workspace the dummy run reserves (``attention_impl``:
        ``(PREFILL_CHUNK_SIZE, cdiv(max_model_len, ratio) + window + max_num_batched_tokens, head_dim)``
        bf16, the smallest ratio's compressed entries the longest)."""
        at = self.attention
        rows = -(-self.max_len // at.csa_rate) + at.sliding_window + self.batched
        workspace = PREFILL_CHUNK * rows * at.head_dim * WORKSPACE_BYTES
        return component(
            activation.key,
            activation.label + " + DeepSeek-V4 prefill workspace",
            activation.bytes + workspace,
            activation.explain.formula
            + f"; + {PREFILL_CHUNK} x (cdiv(max_model_len, {at.csa_rate}) + window + max_num_batched_tokens)"
            " x head_dim x 2 B (the prefill gather workspace)",
            activation.explain.source + "; layers/deepseek_v4_attention.py attention_impl (dummy run)",
            **activation.explain.inputs,
            prefill_workspace_bytes=workspace,
        )


def dsv4_run(run: InferenceRun) -> InferenceRun:
    """The run with the block size vLLM takes for DeepSeek-V4 when --block-size is not given."""
    if run.block_size != UNSET_BLOCK:
        return run
    return run.model_copy(update={"block_size": PREFERRED_BLOCK})


def layout(at: CompressedAttentionSpec, run: InferenceRun, max_len: int, batched: int) -> Dsv4Layout:
    return Dsv4Layout(
        buckets=buckets(at, run.block_size),
        block=run.block_size,
        max_len=max_len,
        batched=batched,
        attention=at,
    )


def check(at: CompressedAttentionSpec, run: InferenceRun) -> list[str]:
    """What vLLM's DeepSeek-V4 path takes (one-line errors), and a warning for a KV dtype it overrides."""
    if (at.csa_rate, at.hca_rate) != tuple(STATE_BLOCK):
        raise GpumemInputError(
            f"vllm: compress rates {at.csa_rate} / {at.hca_rate}: vLLM's DeepSeek-V4 compressor state takes "
            "rates 4 and 128 only (models/deepseek_v4/compressor.py CompressorStateCache)",
            field="model",
        )
    if run.pp > 1:
        raise GpumemInputError(
            "vllm: DeepSeek-V4 over pipeline stages is not modelled (its packed KV groups per stage); "
            "use --pp 1",
            field="pp",
        )
    if not run.hybrid_kv_cache:
        raise GpumemInputError(
            "vllm: DeepSeek-V4 needs vLLM's hybrid KV-cache manager (its caches have five page sizes: "
            "kv_cache_utils.py group_and_unify_kv_cache_specs); drop --no-hybrid-kv-cache",
            field="hybrid_kv_cache",
        )
    bs = dsv4_run(run).block_size
    if bs % at.hca_rate or bs % SWA_BLOCK:
        raise GpumemInputError(
            f"block_size: {bs} is not a multiple of {at.hca_rate}: vLLM's DeepSeek-V4 pages hold "
            f"block_size / {at.hca_rate} compressed entries (its recipes use 256, the default)",
            field="block_size",
        )
    if run.kv_dtype == "auto":
        return [
            "vllm: vLLM serves DeepSeek-V4 only with --kv-cache-dtype fp8 (models/deepseek_v4 attention "
            "asserts it: 'DeepseekV4 only supports fp8 kv-cache format for now, got auto'): sized with its "
            "fp8_ds_mla cache; add --kv-cache-dtype fp8"
        ]
    if not run.kv_dtype.startswith("fp8"):
        raise GpumemInputError(
            f"kv_dtype: vLLM serves DeepSeek-V4 with an fp8 KV cache only (fp8_ds_mla), not {run.kv_dtype}",
            field="kv_dtype",
        )
    return []
