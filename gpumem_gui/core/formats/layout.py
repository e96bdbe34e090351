"""A spec's parameter tensors laid out for sizing: the tensors outside the decoder stack and one decoder
layer per kind of layer, each under its Hugging Face name and under its GGUF name and shape (as
``convert_hf_to_gguf.py`` writes it), so that :mod:`.accounting` and :mod:`.gguf_plan` size a kind of layer
once and repeat it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpumem_gui.core.formats.gguf_mix import _allows_quantization, _category, _stays_f32
from gpumem_gui.core.spec.altup import altup_layer_kinds
from gpumem_gui.core.spec.encoder_params import modern_layer_kinds
from gpumem_gui.core.spec.kinds import CrossAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor, text_tensors
from gpumem_gui.core.spec.seq2seq_params import seq2seq_layer_kinds
from gpumem_gui.core.spec.state import hybrid_layer_kinds

# ---- GGUF tensor names ----------------------------------------------------------------------------------

# gguf-py's MODEL_TENSOR members by name: gguf-py (and numpy) load in ~0.1 s, so they are looked up the first
# time a GGUF name is needed, not when the core is imported (issue 18)


@functools.cache
def _tensor_name(member: str) -> str:
    """gguf-py TENSOR_NAMES[MODEL_TENSOR.<member>], e.g. 'blk.{bid}.attn_q'."""
    from gguf import MODEL_TENSOR, TENSOR_NAMES

    return TENSOR_NAMES[MODEL_TENSOR[member]]


_LAYER_TENSORS = {
    "self_attn.q_proj": "ATTN_Q",
    "self_attn.k_proj": "ATTN_K",
    "self_attn.v_proj": "ATTN_V",
    "self_attn.o_proj": "ATTN_OUT",
    "self_attn.q_a_proj": "ATTN_Q_A",
    "self_attn.q_b_proj": "ATTN_Q_B",
    "self_attn.kv_a_proj_with_mqa": "ATTN_KV_A_MQA",
    "self_attn.q_a_layernorm": "ATTN_Q_A_NORM",
    "self_attn.kv_a_layernorm": "ATTN_KV_A_NORM",
    "self_attn.q_norm": "ATTN_Q_NORM",
    "self_attn.k_norm": "ATTN_K_NORM",
    "mlp.gate_proj": "FFN_GATE",
    "mlp.up_proj": "FFN_UP",
    "mlp.down_proj": "FFN_DOWN",
    "mlp.gate": "FFN_GATE_INP",
    "mlp.shared_experts.gate_proj": "FFN_GATE_SHEXP",
    "mlp.shared_experts.up_proj": "FFN_UP_SHEXP",
    "mlp.shared_experts.down_proj": "FFN_DOWN_SHEXP",
    "mlp.shared_expert_gate": "FFN_GATE_INP_SHEXP",
    "mlp.experts.down_proj": "FFN_DOWN_EXP",
}
_LAYER_NORMS = (
    "ATTN_NORM",
    "FFN_NORM",
    "ATTN_POST_NORM",
    "FFN_POST_NORM",
)
_GLOBAL_TENSORS = {
    "embed_tokens": "token_embd",
    "embed_positions": "position_embd",
    "embedding_norm": "token_embd_norm",
    "norm": "output_norm",
    "lm_head": "output",
}


@dataclass(frozen=True, slots=True)
class _GName:
    name: str
    shape: tuple[int, ...]
    component: str
    layer: int | None


def _split_suffix(name: str) -> tuple[str, str]:
    """('layers.3.self_attn.q_proj', 'weight'); fused expert tensors have no suffix."""
    base, _, last = name.rpartition(".")
    if last in ("weight", "bias"):
        return base, last
    return name, ""


def _gguf_names(spec: ModelSpec, tensors: Iterable[Tensor]) -> Iterator[_GName]:
    """Our tensors under their GGUF names and shapes (gguf-py TENSOR_NAMES, convert_hf_to_gguf.py splits)."""
    fused = spec.traits.fused_qkv and spec.mla is None  # MLA has no k_proj/v_proj
    qkv: dict[tuple[int | None, str], list[int]] = {}
    for t in tensors:
        base, suffix = _split_suffix(t.name)
        if t.layer is None:
            stem = _GLOBAL_TENSORS.get(base, base)
            yield _GName(f"{stem}.{suffix}" if suffix else stem, t.shape, t.component, None)
            continue
        i = t.layer
        rest = base.split(".", 2)[2]
        blk = f"blk.{i}."
        if fused and rest in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            acc = qkv.setdefault((i, suffix), [0, *t.shape[1:]])
            acc[0] += t.shape[0]
            if rest == "self_attn.v_proj":
                name = _tensor_name("ATTN_QKV").format(bid=i)
                yield _GName(f"{name}.{suffix}", tuple(acc), t.component, i)
            continue
        if rest.startswith("norm") and rest[4:].isdigit():
            k = int(rest[4:])
            stem = (
                _tensor_name(_LAYER_NORMS[k]).format(bid=i) if k < len(_LAYER_NORMS) else f"{blk}norm{k}_norm"
            )
            yield _GName(f"{stem}.{suffix}", t.shape, t.component, i)
            continue
        if rest == "self_attn.kv_b_proj" and spec.mla is not None:
            # split into k_b [heads, kv_lora_rank, qk_nope] and v_b [heads, v_head_dim, kv_lora_rank]
            # (convert_hf_to_gguf.py DeepseekV2Model.modify_tensors, MLA absorption)
            a, m = spec.num_attention_heads, spec.mla
            r = t.shape[1]
            yield _GName(
                _tensor_name("ATTN_K_B").format(bid=i) + ".weight",
                (a, r, m.qk_nope_head_dim),
                t.component,
                i,
            )
            yield _GName(
                _tensor_name("ATTN_V_B").format(bid=i) + ".weight",
                (a, m.v_head_dim, r),
                t.component,
                i,
            )
            continue
        if rest == "mlp.experts.gate_up_proj":
            e, rows, cols = t.shape
            if spec.mlp_gated:
                for key in ("FFN_GATE_EXP", "FFN_UP_EXP"):
                    yield _GName(
                        _tensor_name(key).format(bid=i) + ".weight", (e, rows // 2, cols), t.component, i
                    )
            else:
                yield _GName(_tensor_name("FFN_UP_EXP").format(bid=i) + ".weight", t.shape, t.component, i)
            continue
        if rest.startswith("mlp.experts.") and rest.endswith("_bias"):
            stem = "ffn_gate_up_exps" if "gate_up" in rest else "ffn_down_exps"
            yield _GName(f"{blk}{stem}.bias", t.shape, t.component, i)
            continue
        key = _LAYER_TENSORS.get(rest)
        stem = _tensor_name(key).format(bid=i) if key is not None else f"{blk}{rest.replace('.', '_')}"
        yield _GName(f"{stem}.{suffix}" if suffix else f"{stem}.weight", t.shape, t.component, i)


# ---- one decoder layer per kind -------------------------------------------------------------------------

# One GGUF tensor of a layer template: (name after "blk.N.", shape, component, category, quantizable,
# written as F32 by the converter, element count)
_Template = tuple[str, tuple[int, ...], str, int, bool, bool, int]


@dataclass(frozen=True, slots=True)
class _Layout:
    """A spec's tensors outside the layer stack, and one decoder layer's tensors per kind of layer.

    ``params.text_tensors`` builds every decoder layer alike except that MoE specs mix MoE and dense layers
    (:meth:`ModelSpec.is_moe_layer`), so a copy of the spec with one layer per kind lists each distinct
    layer once; ``layer_kind[i]`` is the kind of layer ``i``. Sizing a kind once and repeating it keeps
    :func:`weight_bytes` fast for deep models.
    """

    outside: tuple[Tensor, ...]
    kinds: tuple[tuple[Tensor, ...], ...]
    layer_kind: tuple[int, ...]
    gguf_outside: tuple[_Template, ...]
    gguf_kinds: tuple[tuple[_Template, ...], ...]


def _layout(spec: ModelSpec) -> _Layout:
    try:
        return _layout_cached(spec)
    except TypeError:  # a spec with an unhashable field
        return _build_layout(spec)


@functools.lru_cache(maxsize=64)
def _layout_cached(spec: ModelSpec) -> _Layout:
    return _build_layout(spec)


def _kinds(spec: ModelSpec) -> tuple[int, tuple[int, ...], ModelSpec]:
    """Dense and MoE layers (the kinds whose tensors differ), each layer's kind, one layer of each."""
    moe = spec.moe
    n = spec.num_layers
    if spec.mla is not None and spec.mla.indexer is not None and spec.mla.indexer.shared_layers:
        # GLM-5: layers that reuse the previous top-k have no indexer; their tensors differ by layer index
        # too, so every layer is its own kind (sized once each)
        return n, tuple(range(n)), spec
    if moe is None:
        kinds, layer_kind, mini_moe = 1, (0,) * n, None
    elif 0 < spec.num_moe_layers < n:
        kinds = 2
        layer_kind = tuple(1 if spec.is_moe_layer(i) else 0 for i in range(n))
        mini_moe = moe.model_copy(update={"dense_layers": (0,)})
    else:
        kinds, layer_kind = 1, (0,) * n
        mini_moe = moe.model_copy(update={"dense_layers": () if spec.num_moe_layers else (0,)})
    mini = spec.model_copy(update={"num_layers": kinds, "layer_types": (), "moe": mini_moe})
    return kinds, layer_kind, mini


def _build_layout(spec: ModelSpec) -> _Layout:
    mk = model_kinds(spec)
    if mk.model == "hybrid":  # one kind per layer type
        kinds, layer_kind, mini = hybrid_layer_kinds(spec)
    elif mk.model == "encoder" and spec.encoder is not None and spec.encoder.block == "modernbert":
        kinds, layer_kind, mini = modern_layer_kinds(spec)  # layer 0: no attention norm
    elif mk.model == "encoder-decoder":  # T5: first blocks own a bias table, decoder blocks a cross-attention
        kinds, layer_kind, mini = seq2seq_layer_kinds(spec)
    elif spec.altup is not None:  # Gemma 3n: KV-shared layers lack k/v (spec/altup.py)
        kinds, layer_kind, mini = altup_layer_kinds(spec)
    elif spec.gemma4 is not None or spec.deepseek_v4 is not None or mk.of(CrossAttention):
        # Gemma 4: head dims, k = v, sharing and MLP widths differ per layer; Llama 3.2 Vision: the
        # cross-attention layers' norms and gates; DeepSeek-V4: CSA / HCA / sliding compressors per layer
        kinds, layer_kind, mini = spec.num_layers, tuple(range(spec.num_layers)), spec
    else:
        kinds, layer_kind, mini = _kinds(spec)
    outside: list[Tensor] = []
    per_kind: list[list[Tensor]] = [[] for _ in range(kinds)]
    for t in text_tensors(mini):
        if t.layer is None:
            outside.append(t)
        else:
            per_kind[t.layer].append(t)
    if spec.altup is not None:  # the per-layer table and projection are num_layers wide
        outside = [t for t in text_tensors(spec) if t.layer is None]
    # the same tensors under their GGUF names, each list sorted by name as llama-quantize visits them
    gguf_outside = tuple(sorted(_template(g.name, g.shape, g.component) for g in _gguf_names(spec, outside)))
    gguf_kinds = tuple(
        tuple(
            sorted(
                _template(g.name.removeprefix(f"blk.{k}."), g.shape, g.component)
                for g in _gguf_names(spec, tensors)
            )
        )
        for k, tensors in enumerate(per_kind)
    )
    return _Layout(tuple(outside), tuple(tuple(k) for k in per_kind), layer_kind, gguf_outside, gguf_kinds)


def _template(name: str, shape: tuple[int, ...], component: str) -> _Template:
    ndim = len(shape)
    numel = 1
    for d in shape:
        numel *= d
    allows, f32 = _allows_quantization(name, ndim), _stays_f32(name, ndim)
    return name, shape, component, _category(name), allows, f32, numel
