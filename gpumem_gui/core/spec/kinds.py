"""Layer kinds and the model kind: what each layer of a model *is*, as typed, frozen records.

A model's layers fall into a few kinds (vLLM's ``vllm/v1/kv_cache_interface.py`` gives its cache the same
shape: ``FullAttentionSpec``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``,
``MambaSpec``, ``CrossAttentionSpec``, each owning its page size). Each record here names its layers and
carries its own parameters (heads, window, latent rank, indexer width, state shapes), and answers for itself
what one token costs its cache in each engine's layout and what fixed state one sequence keeps:

* :class:`Attention`: full, sliding-window or chunked-local attention (MHA / GQA / MQA);
* :class:`LatentAttention`: MLA, with or without the DSA indexer's key in its layers;
* :class:`SharedKV`: layers reading an earlier layer's cache (Gemma 3n / Gemma 4), caching nothing;
* :class:`CrossAttention`: layers attending to vision tokens (Llama 3.2 Vision), no per-token cache;
* :class:`Bidirectional`: encoder layers (BERT, the encoder stack of T5 / BART), no cache;
* :class:`RecurrentState`: gated DeltaNet, KDA, lightning attention, Mamba-1/2 and short convolutions, a
  fixed state per sequence (a Falcon-H1 layer is in a Mamba record *and* an attention record);
* :class:`MLPOnly`: Nemotron-H's MLP-only layers, neither cache nor state;
* :class:`CompressedAttention`: DeepSeek-V4's CSA / HCA layers, a sliding window plus compressed entries, a
  cache that is a rule of the length (spec/compressed.py), no per-token figure.

:func:`.kinds_of.model_kinds` derives them from a ``ModelSpec`` once (cached), the one place that reads which
sub-spec means which kind; consumers ask the records instead of testing ``spec.mla`` / ``spec.encoder``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.spec.base import Frozen, NonNegInt, PositiveInt
from gpumem_gui.core.spec.compressed import CompressedAttentionSpec, layer_cache_bytes

Layers = tuple[NonNegInt, ...]
# vLLM deepseek_v2.py Indexer.__init__ ``quant_block_size = 128``; SGLang NSATokenToKVPool.quant_block_size
DSA_QUANT_BLOCK = 128
FP32_BYTES = 4  # a float32 scale
BF16_BYTES = 2  # the rope key of fp8_ds_mla (SGLang NSATokenToKVPool.rope_storage_dtype torch.bfloat16)
MLALayout = Literal["latent", "decompressed"]


class Attention(Frozen):
    """Softmax attention over cached keys and values: ``kv_heads x head_dim`` per token for each of K and V;
    a window (sliding) or chunk (chunked local) bounds the tokens transformers keeps
    (``DynamicSlidingWindowLayer``: the last ``window - 1``)."""

    kind: Literal["full_attention", "sliding_attention", "chunked_attention"]
    layers: Layers
    query_heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    window: PositiveInt | None = Field(None, description="sliding_window or attention_chunk_size")
    expands_kv: bool = Field(
        False,
        description="transformers caches K/V broadcast to every query head (Falcon's new decoder "
        "architecture); engines with GQA kernels cache the KV heads",
    )

    def kv_elems(self, tp: int = 1, *, transformers: bool = False) -> tuple[int, int]:
        """(K, V) elements of one token in one layer on one tensor-parallel rank (KV heads split, at least
        one each); ``transformers``: as transformers' cache stores them (Falcon's broadcast)."""
        if transformers and self.expands_kv:
            w = self.query_heads * self.head_dim
        else:
            w = max(1, self.kv_heads // tp) * self.head_dim
        return w, w

    def kept(self, tokens: int) -> int:
        """Tokens one layer of transformers' DynamicCache keeps after ``tokens`` tokens."""
        return min(tokens, self.window - 1) if self.window else tokens


class LatentAttention(Frozen):
    """MLA (DeepSeek-V2/V3, Kimi, GLM-5): one compressed latent of ``kv_lora_rank`` plus the shared rope key
    per token; DSA layers with their own indexer also cache a single-head indexer key of ``indexer_dim``
    (``DynamicIndexedLayer.indexer_keys``; 0 in layers sharing another's top-k)."""

    kind: Literal["mla"] = "mla"
    layers: Layers
    heads: PositiveInt
    kv_heads: PositiveInt = Field(description="num_key_value_heads as the config gives it (Ollama's GGUFs)")
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    indexer_dim: NonNegInt = 0

    @property
    def latent_elems(self) -> int:
        """Elements of the MLA cache per token and layer where K and V are one latent (vLLM's
        ``MLAAttentionSpec`` head size, SGLang's ``MLATokenToKVPool``): kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_elems(self, layout: MLALayout = "latent") -> tuple[int, int]:
        """(K, V) elements as transformers caches them: the latent and the rope key (transformers >= 5), or
        per-head K (nope + rope) and V (older transformers); the indexer key counted with K."""
        if layout == "latent":
            return self.kv_lora_rank + self.indexer_dim, self.qk_rope_head_dim
        k = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return k + self.indexer_dim, self.heads * self.v_head_dim

    def llamacpp_elems(self, full: bool) -> tuple[int, int]:
        """(K, V) row widths in llama.cpp's cache: the latent (K = rank + rope, V = rank, its MLA support) or,
        from an older GGUF conversion, per-head K and V (``n_embd_k_gqa`` / ``n_embd_v_gqa``)."""
        if full:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim), self.heads * self.v_head_dim
        return self.latent_elems, self.kv_lora_rank

    @property
    def indexer_cache_bytes(self) -> int:
        """Bytes of the serving engines' DSA indexer cache per token in one layer with an indexer: its keys in
        fp8 with one fp32 scale per ``DSA_QUANT_BLOCK`` elements, a uint8 buffer (vLLM ``deepseek_v2.py``
        ``Indexer.__init__``: ``DeepseekV32IndexerCache(head_dim=head_dim + head_dim // quant_block_size *
        4, dtype=torch.uint8)``, an ``MLAAttentionSpec`` of its own per layer; SGLang ``NSATokenToKVPool``
        ``index_k_with_scale_buffer``, and ``get_cell_size_per_token``'s indexer term): 132 for a 128 dim."""
        d = self.indexer_dim
        return d + d // DSA_QUANT_BLOCK * FP32_BYTES if d else 0

    @property
    def fp8_ds_mla_bytes(self) -> int:
        """Bytes of one token's latent in an fp8 cache of a DSA model on FlashMLA's sparse kernels: the latent
        in fp8, one fp32 scale per ``DSA_QUANT_BLOCK`` of it, the rope key in bf16 (656 for DeepSeek-V3.2:
        vLLM ``MLAAttentionSpec.real_page_size_bytes`` for ``fp8_ds_mla``, the layout documented in
        ``flashmla_sparse.py``; SGLang ``calculate_mla_kv_cache_dim`` for fp8)."""
        r = self.kv_lora_rank
        return r + r // DSA_QUANT_BLOCK * FP32_BYTES + self.qk_rope_head_dim * BF16_BYTES

    def vllm_bytes(self, kv_elem: float) -> float:
        """Bytes one token costs one layer in vLLM V1: the latent ``MLAAttentionSpec`` in the cache dtype;
        a DSA layer stores an fp8 cache as ``fp8_ds_mla`` (FLASHMLA_SPARSE turns a quantized cache dtype into
        it) and adds its indexer's cache, which vLLM keeps in the same group (``UniformTypeKVCacheSpecs``:
        one block of every layer's page)."""
        if not self.indexer_dim:
            return self.latent_elems * kv_elem
        main = self.fp8_ds_mla_bytes if kv_elem == 1 else self.latent_elems * kv_elem
        return main + self.indexer_cache_bytes

    def sglang_cell_bytes(self, kv_elem: float) -> float:
        """Bytes SGLang counts per token and layer when it sizes the pool (``ModelRunnerKVCacheMixin.
        get_cell_size_per_token``: the latent in the cache dtype plus, for DSA models, the indexer's
        ``index_head_dim + index_head_dim // 128 x 4`` bytes; note its fp8 pool then allocates
        ``fp8_ds_mla_bytes`` per token, more than it counted)."""
        return self.latent_elems * kv_elem + self.indexer_cache_bytes

    @property
    def ollama_width(self) -> int:
        """K + V elements per token in Ollama's deepseek2 GGUFs: per KV head, nope + rope + v."""
        return (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) * self.kv_heads


class SharedKV(Frozen):
    """Layers that read an earlier layer's keys and values and keep no cache (Gemma3nTextAttention
    ``is_kv_shared_layer``; cache_utils makes them dummy layers)."""

    kind: Literal["shared_kv"] = "shared_kv"
    layers: Layers
    sliding: Layers = Field((), description="those of them reading a sliding-window layer's cache")


class CrossAttention(Frozen):
    """Layers attending to vision tokens (MllamaCrossAttentionDecoderLayer): no per-token cache; with images
    each keeps its vision tokens' keys and values for the whole generation (spec/cross_attention.py)."""

    kind: Literal["cross_attention"] = "cross_attention"
    layers: Layers
    kv_heads: PositiveInt
    head_dim: PositiveInt


class Bidirectional(Frozen):
    """Encoder layers (BERT family, the encoder stack of T5 / BART): attention over the whole input, no
    cache (BertModel.forward: use_cache False)."""

    kind: Literal["bidirectional"] = "bidirectional"
    layers: Layers


class RecurrentState(Frozen):
    """Layers keeping a fixed state per sequence whatever its length: a conv state in the activation dtype
    and a recurrent state (fp32, or the activation dtype for lightning attention)."""

    kind: Literal["recurrent"] = "recurrent"
    mixer: Literal["gated_deltanet", "kda", "lightning", "mamba1", "mamba2", "short_conv"]
    layers: Layers
    conv_elems: NonNegInt
    recurrent_elems: NonNegInt
    recurrent_fp32: bool = True

    def state_bytes(self, activation_bytes: float) -> int:
        """Bytes one sequence keeps in one layer of this kind (transformers' cache)."""
        rec = RECURRENT_STATE_BYTES if self.recurrent_fp32 else activation_bytes
        return round(self.conv_elems * activation_bytes) + round(self.recurrent_elems * rec)


class MLPOnly(Frozen):
    """Layers of an MLP alone (NemotronHBlock 'mlp'): no cache, no state."""

    kind: Literal["mlp"] = "mlp"
    layers: Layers


class CompressedAttention(Frozen):
    """DeepSeek-V4's compressed layers (DeepseekV4HCACache / DeepseekV4CSACache): the sliding K=V window plus
    the compressor's buffered projections and closed-window entries (CSA: the indexer's too, and the
    overlap state), a cache whose bytes are a rule of the length, not a per-token figure."""

    kind: Literal["compressed_sparse_attention", "heavily_compressed_attention"]
    layers: Layers
    attention: CompressedAttentionSpec

    def cache_bytes(self, tokens: int, activation_bytes: int = 2) -> int:
        """Bytes one sequence keeps in one layer of this kind after ``tokens`` tokens (transformers' cache,
        measured: tests/reference/extra/compressed_cache.json)."""
        return layer_cache_bytes(self.attention, self.kind, tokens, activation_bytes)


# every RecurrentState.mixer
STATE_MIXERS = frozenset({"gated_deltanet", "kda", "lightning", "mamba1", "mamba2", "short_conv"})
RECURRENT_STATE_BYTES = 4  # fp32 (torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule)

LayerKind = Annotated[
    Attention
    | LatentAttention
    | SharedKV
    | CrossAttention
    | Bidirectional
    | RecurrentState
    | MLPOnly
    | CompressedAttention,
    Field(discriminator="kind"),
]
CACHED = (Attention, LatentAttention)  # the kinds with a per-token cache
Bound = tuple[Literal["sliding", "chunked"], int]  # what bounds a layer's cached tokens (ModelKinds.bounds)
ModelKindName = Literal["decoder", "hybrid", "encoder", "encoder-decoder"]


class ModelKinds(Frozen):
    """A model's kind and its layers' kinds (a layer may belong to two: Falcon-H1's attention + Mamba)."""

    model: ModelKindName
    num_layers: PositiveInt
    layers: tuple[LayerKind, ...]
    compressed: CompressedAttentionSpec | None = Field(
        None,
        description="the compressed attention the model's layers run (DeepSeek-V4, spec/compressed.py: its "
        "sliding layers' windows belong to the same cache), the capability the engines take their "
        "compressed-cache paths on; None for every other model",
    )

    def of(self, *types: type) -> tuple[LayerKind, ...]:
        return tuple(k for k in self.layers if isinstance(k, types))

    @property
    def attention(self) -> tuple[Attention | LatentAttention, ...]:
        """The kinds with a per-token cache, in order of their first layer."""
        return self.of(*CACHED)  # type: ignore[return-value]

    @property
    def state(self) -> tuple[RecurrentState, ...]:
        return self.of(RecurrentState)  # type: ignore[return-value]

    @property
    def latent(self) -> LatentAttention | None:
        """The model's MLA kind with an indexer key where it has one (else its only MLA kind)."""
        mla = self.of(LatentAttention)
        return max(mla, key=lambda k: k.indexer_dim) if mla else None  # type: ignore[return-value]

    def layers_of(self, name: str) -> tuple[int, ...]:
        """The layers of the kinds named ``name`` (a kind's ``kind``, an attention kind's ``full_attention`` /
        ``sliding_attention`` / ``chunked_attention``, or a state mixer), in order; ``sliding_attention``
        includes the shared-KV layers that read a sliding layer's cache (their layer type)."""
        return self._layers_by_name.get(name, ())

    @cached_property
    def _layers_by_name(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, set[int]] = {}
        for k in self.layers:
            out.setdefault(k.kind, set()).update(k.layers)
            if isinstance(k, RecurrentState):
                out.setdefault(k.mixer, set()).update(k.layers)
            if isinstance(k, SharedKV):
                out.setdefault("sliding_attention", set()).update(k.sliding)
        return {name: tuple(sorted(v)) for name, v in out.items()}

    def bounds(self, chunked: bool = True) -> dict[int, Bound | None]:
        """Each layer with its own per-token cache and what bounds the tokens it keeps in an engine's pool:
        ("sliding", window), ("chunked", chunk) or None (every token; a chunked layer too where the engine
        pages it as full attention: ``chunked`` False). Computed once per kinds; do not modify."""
        return self._bounds[chunked]

    @cached_property
    def widest_bound(self) -> int:
        """The largest window or chunk bounding any layer's cached tokens (0: none)."""
        return max((b[1] for b in self.bounds().values() if b), default=0)

    @cached_property
    def _bounds(self) -> dict[bool, dict[int, Bound | None]]:
        out: dict[int, Bound | None] = {}
        for k in self.attention:  # a window on an Attention kind is a sliding window or a chunk
            b = (k.kind.split("_")[0], k.window) if isinstance(k, Attention) and k.window else None
            out.update(dict.fromkeys(k.layers, b))  # type: ignore[arg-type]
        out = dict(sorted(out.items()))
        return {True: out, False: {i: b if b and b[0] == "sliding" else None for i, b in out.items()}}

    def per_layer(self, value: object, kinds: tuple[LayerKind, ...]) -> tuple[int, ...]:
        """``value(kind)`` on each layer of ``kinds``, 0 elsewhere (a callable of one kind)."""
        out = [0] * self.num_layers
        for k in kinds:
            v = value(k)  # type: ignore[operator]
            for i in k.layers:
                out[i] = v
        return tuple(out)
