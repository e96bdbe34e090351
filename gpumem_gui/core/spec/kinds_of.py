"""A model's layer kinds derived from its :class:`ModelSpec`: the one place that reads which of the fields the
readers set (layer types, the MLA / linear-attention / Mamba / short-conv sub-specs, shared-KV layers, the
encoder and encoder-decoder specs) means which kind (the records: :mod:`.kinds`)."""

from __future__ import annotations

from functools import lru_cache

from gpumem_gui.core.spec import gemma4
from gpumem_gui.core.spec.kinds import (
    Attention,
    Bidirectional,
    CompressedAttention,
    CrossAttention,
    LatentAttention,
    LayerKind,
    MLPOnly,
    ModelKindName,
    ModelKinds,
    RecurrentState,
    SharedKV,
)
from gpumem_gui.core.spec.model import ModelSpec


def _group(keys: list[tuple[object, ...] | None]) -> dict[tuple[object, ...], list[int]]:
    out: dict[tuple[object, ...], list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            out.setdefault(key, []).append(i)
    return out


def _attention_key(spec: ModelSpec, i: int, lt: str) -> tuple[object, ...] | None:
    """The attention kind of layer ``i`` as a hashable key (None: the layer has no per-token cache)."""
    if lt not in ("full_attention", "sliding_attention", "chunked_attention", "hybrid"):
        return None
    if i in spec.kv_shared_layers:
        return None
    kind = "full_attention" if lt == "hybrid" else lt
    window = spec.sliding_window if kind == "sliding_attention" else None
    window = spec.attention_chunk_size if kind == "chunked_attention" else window
    if spec.mla is not None:
        ix = spec.mla.indexer
        return ("mla", ix.head_dim if ix is not None and ix.has_indexer(i) else 0)
    kv_heads, head_dim = spec.num_kv_heads, spec.head_dim
    if spec.gemma4 is not None:  # per-layer-type head dim and KV heads (spec/gemma4.py)
        kv_heads, head_dim = gemma4.kv_heads(spec, i), gemma4.head_dim(spec, i)
    return ("attn", kind, kv_heads, head_dim, window)


def _attention_kind(spec: ModelSpec, key: tuple[object, ...], layers: list[int]) -> LayerKind:
    if key[0] == "mla":
        m = spec.mla
        assert m is not None
        return LatentAttention(
            layers=tuple(layers),
            heads=spec.num_attention_heads,
            kv_heads=spec.num_kv_heads,
            kv_lora_rank=m.kv_lora_rank,
            qk_nope_head_dim=m.qk_nope_head_dim,
            qk_rope_head_dim=m.qk_rope_head_dim,
            v_head_dim=m.v_head_dim,
            indexer_dim=key[1],  # type: ignore[arg-type]
        )
    _, kind, kv_heads, head_dim, window = key
    return Attention(
        kind=kind,  # type: ignore[arg-type]
        layers=tuple(layers),
        query_heads=spec.num_attention_heads,
        kv_heads=kv_heads,  # type: ignore[arg-type]
        head_dim=head_dim,  # type: ignore[arg-type]
        window=window,  # type: ignore[arg-type]
        expands_kv=spec.transformers_expands_kv,
    )


def state_shape(spec: ModelSpec, lt: str) -> tuple[str, int, int, bool] | None:
    """(mixer, conv elements, recurrent elements, fp32 recurrent state) one sequence keeps in a layer of type
    ``lt`` (None: no state): the gated DeltaNet's / KDA's conv over q, k, v and its ``(hv, dk, dv)`` state; a
    short conv's ``hidden x kernel`` only (Lfm2ShortConv: cache.update_conv_state); Mamba's conv and SSM
    state (also in Falcon-H1's hybrid layers)."""
    la, sc, mb = spec.linear_attention, spec.short_conv, spec.mamba
    if lt == "linear_attention" and la is not None:
        return la.kind, la.conv_state_elems, la.recurrent_state_elems, la.recurrent_state_fp32
    if lt == "conv" and sc is not None:
        return "short_conv", spec.hidden_size * sc.kernel, 0, True
    if lt in ("mamba", "hybrid") and mb is not None:
        return mb.kind, mb.conv_state_elems, mb.recurrent_state_elems, True
    return None


# model_kinds' cache by identity (the spec kept, so its id is not reused): hashing a ModelSpec costs ~4 us
_BY_ID: dict[int, tuple[ModelSpec, ModelKinds]] = {}
_BY_ID_MAX = 512


def model_kinds(spec: ModelSpec) -> ModelKinds:
    """The model's kind and its layers' kinds, derived once per spec (by identity, else by value)."""
    hit = _BY_ID.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    kinds = _derive(spec)
    if len(_BY_ID) >= _BY_ID_MAX:
        _BY_ID.pop(next(iter(_BY_ID)), None)
    _BY_ID[id(spec)] = (spec, kinds)
    return kinds


@lru_cache(maxsize=512)
def _derive(spec: ModelSpec) -> ModelKinds:
    types = spec.resolved_layer_types
    if spec.encoder is not None:
        return ModelKinds(
            model="encoder",
            num_layers=spec.num_layers,
            layers=(Bidirectional(layers=tuple(range(spec.num_layers))),),
        )
    enc = spec.seq2seq.encoder_layers if spec.seq2seq is not None else 0
    kinds: list[LayerKind] = []
    if enc:
        kinds.append(Bidirectional(layers=tuple(range(enc))))
    keys = [None if i < enc else _attention_key(spec, i, lt) for i, lt in enumerate(types)]
    for key, layers in _group(keys).items():
        kinds.append(_attention_kind(spec, key, layers))
    if spec.kv_shared_layers:
        shared, n = tuple(spec.kv_shared_layers), len(types)  # a mini spec keeps the model's indices
        sliding = tuple(i for i in shared if i < n and types[i] == "sliding_attention")
        kinds.append(SharedKV(layers=shared, sliding=sliding))
    for (mixer, conv, rec, fp32), layers in _group([state_shape(spec, lt) for lt in types]).items():
        kinds.append(
            RecurrentState(
                mixer=mixer,  # type: ignore[arg-type]
                layers=tuple(layers),
                conv_elems=conv,  # type: ignore[arg-type]
                recurrent_elems=rec,  # type: ignore[arg-type]
                recurrent_fp32=fp32,  # type: ignore[arg-type]
            )
        )
    cross = tuple(i for i, lt in enumerate(types) if lt == "cross_attention")
    if cross:
        kinds.append(CrossAttention(layers=cross, kv_heads=spec.num_kv_heads, head_dim=spec.head_dim))
    compressed = spec.deepseek_v4.attention if spec.deepseek_v4 is not None else None
    if compressed is not None:  # DeepSeek-V4's CSA / HCA layers (its sliding ones are Attention above)
        for kind in ("compressed_sparse_attention", "heavily_compressed_attention"):
            layers = tuple(i for i, lt in enumerate(types) if lt == kind)
            if layers:
                kinds.append(CompressedAttention(kind=kind, layers=layers, attention=compressed))  # type: ignore[arg-type]
    mlp = tuple(i for i, lt in enumerate(types) if lt == "mlp")
    if mlp:
        kinds.append(MLPOnly(layers=mlp))
    kinds.sort(key=lambda k: k.layers[0])
    model: ModelKindName = "encoder-decoder" if enc else "decoder"
    if model == "decoder" and any(isinstance(k, RecurrentState) for k in kinds):
        model = "hybrid"
    return ModelKinds(model=model, num_layers=spec.num_layers, layers=tuple(kinds), compressed=compressed)
