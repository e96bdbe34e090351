"""llama.cpp's llama-quantize mixes: the ggml type each tensor of a GGUF file gets in a file type such as
Q4_K_M.

Our own implementation of ``llama_tensor_get_type_impl`` and its helpers (``tensor_get_category``,
``tensor_allows_quantization``, ``tensor_type_fallback``) in ``src/llama-quant.cpp``, read at
ggml-org/llama.cpp commit 007dbbf. ``_mix_type`` applies the rules that hold for every tensor (output,
token embedding, MXFP4_MOE, the 1-2 bit IQ mixes), then the rule of the tensor's category from
``_CATEGORY_RULES``; the per-category rules update the running counters of ``_QuantState`` as llama.cpp
does, so tensors must be visited in llama.cpp's order (:mod:`.gguf_plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumem_gui.core.formats.gguf_types import _GGML_BLOCKS, _block_size

# tensor_get_category (src/llama-quant.cpp)
_OUTPUT, _TOKEN_EMBD, _QKV, _KV_B, _V, _K, _Q, _AO, _UP, _GATE, _DOWN, _OTHER = range(12)
_ATTN_V_LIKE = frozenset({_V, _QKV, _KV_B})


def _category(name: str) -> int:
    if name == "output.weight":
        return _OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return _TOKEN_EMBD
    for needle, cat in (
        ("attn_qkv.weight", _QKV),
        ("attn_kv_b.weight", _KV_B),
        ("attn_v.weight", _V),
        ("attn_k.weight", _K),
        ("attn_q.weight", _Q),
        ("attn_output.weight", _AO),
        ("ffn_up", _UP),
        ("ffn_gate", _GATE),
        ("ffn_down", _DOWN),
    ):
        if needle in name:
            return cat
    return _OTHER


def _allows_quantization(name: str, ndim: int) -> bool:
    """tensor_allows_quantization for the tensors a ModelSpec has (2-D/3-D weights, no norms or routers)."""
    return (
        ndim >= 2
        and name.endswith("weight")
        and "_norm.weight" not in name
        and "ffn_gate_inp.weight" not in name
        and name != "position_embd.weight"
    )


def _stays_f32(name: str, ndim: int) -> bool:
    """convert_hf_to_gguf.py prepare_tensors: tensors always written as F32."""
    return (
        ndim <= 1
        or name.endswith("_norm.weight")
        or not name.endswith(".weight")
        or "ffn_gate_inp.weight" in name
        or name == "position_embd.weight"
    )


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# tensor_type_fallback: a compatible type when the row length does not divide the block size.
_FALLBACK = {
    **dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
    **dict.fromkeys(("Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}

_IQ_LOW_OUTPUT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_IQ_LOW = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_MOE8_ATTN_OUT_Q5K = frozenset(
    {
        "Q2_K",
        "IQ3_XS",
        "IQ3_XXS",
        "Q3_K_S",
        "Q3_K_M",
        "IQ4_NL",
        "Q4_K_S",
        "Q4_K_M",
        "IQ3_S",
        "IQ3_M",
        "IQ4_XS",
    }
)


# File types whose low-bit tensors llama-quantize only writes with an importance matrix
# (tensor_requires_imatrix); for the others we assume none was given (the llama-quantize default).
_FTYPES_WITH_IMATRIX = frozenset(
    {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
)


@dataclass(slots=True)
class _QuantState:
    """The model facts and running counters of llama.cpp's quantize_state_impl."""

    ftype: str
    n_expert: int
    n_gqa: int
    is_falcon: bool
    is_70b: bool
    has_imatrix: bool
    tied: bool
    n_layer: int
    n_attention_wv: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _layer_info(qs: _QuantState, counter: int, layer: int | None) -> tuple[int, int]:
    # MoE models read the layer from the tensor name (experts are not consecutive), others count tensors
    if qs.n_expert > 1 and layer is not None:
        return layer, qs.n_layer
    return counter, qs.n_layer


# ---- llama_tensor_get_type_impl, rule by rule -----------------------------------------------------------

# token_embd when it is not tied to the output (a tied one follows the output rule)
_TOKEN_EMBD_TYPE = {
    **dict.fromkeys(("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"), "Q2_K"),
    **dict.fromkeys(("IQ2_S", "IQ2_M", "IQ3_XXS"), "IQ3_S"),
    **dict.fromkeys(("TQ1_0", "TQ2_0"), "Q4_K"),
}
# attn_k (unless 8 experts) and attn_q in the IQ3 mixes
_ATTN_QK_TYPE = {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}
# attn_output of a non-Falcon model without 8 experts
_ATTN_OUT_TYPE = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}


def _output_type(qs: _QuantState, t: str, ne0: int) -> str:
    """output.weight, and token_embd when the two are tied."""
    ft = qs.ftype
    if ft == "MXFP4_MOE" or qs.is_falcon or ne0 % _block_size(t):
        return "Q8_0"
    if ft in _IQ_LOW_OUTPUT:
        return "Q5_K"
    return t if t == "Q8_0" else "Q6_K"


def _iq_low_type(qs: _QuantState, t: str, cat: int) -> str:
    """Every tensor but output and token_embd in the 1-2 bit IQ mixes (``_IQ_LOW``)."""
    ft, n_exp, gqa = qs.ftype, qs.n_expert, qs.n_gqa
    if cat in _ATTN_V_LIKE:
        t = "Q4_K" if gqa >= 4 or n_exp >= 4 else ("IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K")
        qs.i_attention_wv += 1
    elif n_exp == 8 and cat == _K:
        t = "Q4_K"
    elif cat == _DOWN:
        if qs.i_ffn_down < qs.n_layer // 8:
            t = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
        qs.i_ffn_down += 1
    elif cat == _AO:
        if n_exp == 8:
            t = "Q5_K"
        elif ft in ("IQ1_S", "IQ1_M"):
            t = "IQ2_XXS"
        elif ft in ("IQ2_S", "IQ2_M"):
            t = "IQ3_S"
    return t


def _attn_v_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """attn_v and the tensors that hold V (fused attn_qkv, MLA's attn_kv_b)."""
    ft, n_exp, gqa = qs.ftype, qs.n_expert, qs.n_gqa
    i, n = qs.i_attention_wv, qs.n_attention_wv
    if ft == "Q2_K":
        t = "Q4_K" if gqa >= 4 else "Q3_K"
    elif ft == "Q2_K_S" and gqa >= 4:
        t = "Q4_K"
    elif ft == "IQ3_XXS":
        t = "Q4_K" if gqa >= 4 else ("IQ3_S" if not qs.has_imatrix else "IQ3_XXS")
    elif (ft in ("IQ3_XS", "IQ3_S") and gqa >= 4) or ft == "IQ3_M":
        t = "Q4_K"
    elif ft == "Q3_K_M":
        t = "Q5_K" if i < 2 else "Q4_K"
    elif ft == "Q3_K_L" or (ft in ("IQ4_NL", "IQ4_XS") and gqa >= 4):
        t = "Q5_K"
    elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
        t = "Q6_K"
    elif ft == "Q4_K_S" and i < 4:
        t = "Q5_K"
    if qs.is_70b and t in ("Q3_K", "Q4_K"):
        t = "Q5_K"  # 8 heads share attn_v in the 70B: more bits for a small tensor
    if n_exp == 8:
        t = "Q8_0"
    qs.i_attention_wv += 1
    return t


def _attn_k_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """attn_k."""
    return "Q8_0" if qs.n_expert == 8 else _ATTN_QK_TYPE.get(qs.ftype, t)


def _attn_q_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """attn_q."""
    return _ATTN_QK_TYPE.get(qs.ftype, t)


def _ffn_down_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """ffn_down, the experts' and shared expert's included; counted per layer."""
    ft, n_exp = qs.ftype, qs.n_expert
    i, n = _layer_info(qs, qs.i_ffn_down, layer)
    if ft == "Q2_K":
        t = "Q3_K"
    elif ft == "Q2_K_S":
        if i < n // 8:
            t = "Q4_K"
    elif ft == "IQ3_XXS" and not qs.has_imatrix:
        t = "Q4_K" if i < n // 8 else "Q3_K"
    elif ft == "Q3_K_M":
        more = not qs.is_falcon or _use_more_bits(i, n)
        t = "Q5_K" if i < n // 16 else ("Q4_K" if more else "Q3_K")
    elif ft == "IQ3_M" and (i < n // 8 or (n_exp == 8 and _use_more_bits(i, n))):
        t = "Q4_K"
    elif ft == "Q3_K_L":
        t = "Q4_K" if qs.is_falcon else "Q5_K"
    elif ft == "Q4_K_M":
        if qs.is_falcon:
            t = "Q6_K" if i < n // 16 else ("Q5_K" if _use_more_bits(i, n) else "Q4_K")
        elif _use_more_bits(i, n):
            t = "Q6_K"
    elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not qs.has_imatrix:
        t = "Q5_K"
    elif ft == "Q5_K_M" and _use_more_bits(i, n):
        t = "Q6_K"
    elif ft == "Q4_K_S" and not qs.is_falcon and i < n // 8:
        t = "Q5_K"
    elif ft in ("Q4_0", "Q5_0") and qs.has_imatrix and i < n // 8:
        t = "Q4_1" if ft == "Q4_0" else "Q5_1"
    qs.i_ffn_down += 1
    return t


def _attn_output_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """attn_output."""
    ft = qs.ftype
    if qs.is_falcon:
        return "Q4_K" if ft == "Q3_K_L" else t
    if qs.n_expert == 8:
        return "Q5_K" if ft in _MOE8_ATTN_OUT_Q5K else t
    return _ATTN_OUT_TYPE.get(ft, t)


def _ffn_gate_up_type(qs: _QuantState, t: str, cat: int, layer: int | None) -> str:
    """ffn_gate and ffn_up, the experts' and shared expert's included; counted per layer."""
    ft = qs.ftype
    counter = qs.i_ffn_gate if cat == _GATE else qs.i_ffn_up
    i, n = _layer_info(qs, counter, layer)
    if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
        t = "IQ3_XXS"
    if cat == _GATE:
        qs.i_ffn_gate += 1
    else:
        qs.i_ffn_up += 1
    return t


# The rule of each tensor category (a category not listed keeps the mix's default type).
_CATEGORY_RULES: dict[int, Callable[[_QuantState, str, int, int | None], str]] = {
    **dict.fromkeys(_ATTN_V_LIKE, _attn_v_type),
    _K: _attn_k_type,
    _Q: _attn_q_type,
    _DOWN: _ffn_down_type,
    _AO: _attn_output_type,
    _GATE: _ffn_gate_up_type,
    _UP: _ffn_gate_up_type,
}


def _mix_type(qs: _QuantState, t: str, cat: int, ne0: int, ne2: int, layer: int | None) -> str:
    """llama_tensor_get_type_impl: the type a llama-quantize mix gives one tensor (``t``: the default)."""
    if cat == _OUTPUT or (qs.tied and cat == _TOKEN_EMBD):
        return _output_type(qs, t, ne0)
    if qs.ftype == "MXFP4_MOE":
        return "MXFP4" if ne2 > 1 else "Q8_0"
    if cat == _TOKEN_EMBD:
        return _TOKEN_EMBD_TYPE.get(qs.ftype, t)
    if qs.ftype in _IQ_LOW:
        return _iq_low_type(qs, t, cat)
    rule = _CATEGORY_RULES.get(cat)
    return t if rule is None else rule(qs, t, cat, layer)


def _fallback(type_name: str, ne0: int) -> tuple[str, str]:
    """tensor_type_fallback: (type, note) for a row of ``ne0`` weights."""
    block = _GGML_BLOCKS[type_name][0]
    if ne0 % block == 0:
        return type_name, ""
    alt = _FALLBACK.get(type_name)
    if alt is None:
        # llama-quantize aborts ("no tensor type fallback is defined"); we keep the tensor in F16 instead
        return "F16", f"{type_name} needs rows divisible by {block}; llama-quantize aborts here"
    if ne0 % _GGML_BLOCKS[alt][0]:
        return "F16", f"rows of {ne0} fit neither {type_name} nor {alt}: F16"
    return alt, f"rows of {ne0} not divisible by {block}: {type_name} -> {alt}"
