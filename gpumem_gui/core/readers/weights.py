"""Exact weight accounting from checkpoint file headers: one :class:`WeightsInventory` per checkpoint.

The readers (:mod:`~gpumem_gui.core.readers.safetensors`, :mod:`~gpumem_gui.core.readers.gguf`) list every
stored tensor with its dtype, shape and exact byte size, read from the file headers only (tensor data is
never read). This module holds the result types and :func:`classify_tensor`, which files a tensor name
(Hugging Face or GGUF naming) under one of the components of :data:`~gpumem_gui.core.spec.params.COMPONENTS`,
so that stored bytes can be compared component by component with the parameter accounting.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import Field, model_validator

from gpumem_gui.core.spec.model import Frozen
from gpumem_gui.core.spec.params import COMPONENTS

OTHER = "other"
INVENTORY_COMPONENTS: tuple[str, ...] = (*COMPONENTS, OTHER)
"""Components a stored tensor can belong to: the parameter components plus ``other`` (unrecognised)."""


class WeightTensor(Frozen):
    """One tensor as stored in a checkpoint file.

    ``shape`` is in row-major (PyTorch) order for both formats; GGUF stores dimensions fastest-first and
    is reversed on reading. ``elements`` is the product of ``shape``: the stored element count (for
    safetensors, packed quantized tensors such as GPTQ's ``qweight`` count their int32 words; for GGUF,
    the logical weights a block-quantized tensor holds). ``layer`` is the text decoder layer the tensor
    belongs to (None outside the layer stack, and for vision towers).
    """

    name: str = Field(min_length=1)
    dtype: str = Field(min_length=1)
    shape: tuple[int, ...]
    elements: int = Field(ge=0)
    nbytes: int = Field(ge=0)
    component: str
    layer: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> WeightTensor:
        if any(d < 0 for d in self.shape):
            raise ValueError(f"tensor '{self.name}' has a negative dimension in {self.shape}")
        if _prod(self.shape) != self.elements:
            raise ValueError(
                f"tensor '{self.name}': elements {self.elements} != product of shape {self.shape}"
            )
        if self.component not in INVENTORY_COMPONENTS:
            raise ValueError(f"tensor '{self.name}': unknown component '{self.component}'")
        return self


class WeightsInventory(Frozen):
    """Every tensor of a checkpoint (one file or a sharded set) with exact byte and element totals.

    ``bytes_by_component`` / ``elements_by_component`` list every component of
    :data:`INVENTORY_COMPONENTS` (zero when absent); ``bytes_by_dtype`` / ``elements_by_dtype`` only the
    dtypes present. ``quantization`` is the detected scheme (``gptq``, ``awq``, ``bitsandbytes-4bit``,
    ``bitsandbytes-8bit``, ``fp8``, ``compressed-tensors``, ``mxfp4``, ... or a GGUF file type such as
    ``Q4_K_M``), None for plain floating-point checkpoints.
    """

    format: Literal["safetensors", "gguf"]
    source: str
    files: tuple[str, ...]
    tensor_count: int = Field(ge=0)
    total_bytes: int = Field(ge=0)
    total_elements: int = Field(ge=0)
    bytes_by_dtype: dict[str, int]
    elements_by_dtype: dict[str, int]
    bytes_by_component: dict[str, int]
    elements_by_component: dict[str, int]
    quantization: str | None = None
    tensors: tuple[WeightTensor, ...]

    @model_validator(mode="after")
    def _check_totals(self) -> WeightsInventory:
        if self.tensor_count != len(self.tensors):
            raise ValueError(f"tensor_count {self.tensor_count} != {len(self.tensors)} tensors listed")
        expected = _aggregate(self.tensors)
        for field, value in expected.items():
            if getattr(self, field) != value:
                raise ValueError(f"{field} does not match the tensors listed")
        return self

    def tensor(self, name: str) -> WeightTensor | None:
        """The tensor called ``name``, or None."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _aggregate(tensors: Iterable[WeightTensor]) -> dict[str, object]:
    by_dtype: dict[str, int] = {}
    el_dtype: dict[str, int] = {}
    by_comp = dict.fromkeys(INVENTORY_COMPONENTS, 0)
    el_comp = dict.fromkeys(INVENTORY_COMPONENTS, 0)
    total_b = total_e = 0
    for t in tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
        el_dtype[t.dtype] = el_dtype.get(t.dtype, 0) + t.elements
        by_comp[t.component] += t.nbytes
        el_comp[t.component] += t.elements
        total_b += t.nbytes
        total_e += t.elements
    return {
        "total_bytes": total_b,
        "total_elements": total_e,
        "bytes_by_dtype": dict(sorted(by_dtype.items())),
        "elements_by_dtype": dict(sorted(el_dtype.items())),
        "bytes_by_component": by_comp,
        "elements_by_component": el_comp,
    }


def build_inventory(
    *,
    format: Literal["safetensors", "gguf"],
    source: str,
    files: Iterable[str],
    tensors: Iterable[WeightTensor],
    quantization: str | None,
) -> WeightsInventory:
    """A :class:`WeightsInventory` with every total computed from ``tensors``."""
    ts = tuple(tensors)
    # every figure the validator would check is computed right here from the tensors
    return WeightsInventory.model_construct(
        format=format,
        source=source,
        files=tuple(files),
        tensor_count=len(ts),
        quantization=quantization,
        tensors=ts,
        **_aggregate(ts),
    )


def make_tensor(name: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> WeightTensor:
    """A :class:`WeightTensor` classified by :func:`classify_tensor`, from values the caller has checked."""
    component, layer = classify_tensor(name)
    # The readers pass values they have already checked (non-negative integer dimensions, byte sizes
    # that match the dtype), so the model is built without re-validation: checkpoints with ~10^5
    # tensors (DeepSeek-V3 in FP8) would otherwise spend seconds in it.
    return WeightTensor.model_construct(
        name=name,
        dtype=dtype,
        shape=shape,
        elements=_prod(shape),
        nbytes=nbytes,
        component=component,
        layer=layer,
    )


# ---- classification ---------------------------------------------------------------------------------
#
# Names below are module names as they appear in checkpoints: Hugging Face transformers modeling code
# (src/transformers/models/<type>/modeling_<type>.py), Mistral's native consolidated format, and GGUF
# (gguf-py/gguf/constants.py TENSOR_NAMES in llama.cpp). A tensor's name is split at dots; the rules
# look at module segments, so quantization side-tensors (``q_proj.qweight``, ``q_proj.scales``,
# ``q_proj.weight.absmax``, ``q_proj.SCB``, ``q_proj.weight_scale_inv``, ...) land in the component of
# the weight they belong to.

# Containers whose next segment is the decoder layer index (model.layers.N, transformer.h.N, blk.N, ...).
_LAYER_CONTAINERS = frozenset({"layers", "layer", "h", "blocks", "block", "blk"})

# Vision towers and projectors of multimodal checkpoints (LLaVA, Gemma 3, Qwen2-VL, Pixtral, Idefics, ...).
_VISION_SEGMENTS = frozenset(
    {
        "vision_tower",
        "vision_model",
        "visual",
        "multi_modal_projector",
        "mm_projector",
        "vision_encoder",
        "vision_language_adapter",
        "vision_embed_tokens",
        "image_newline",
    }
)
# GGUF multimodal projector files (clip.cpp): vision tensors start "v." and projector tensors "mm.";
# audio tensors start "a." (and "mm.a." for the audio projector).
_GGUF_VISION_PREFIXES = frozenset({"v", "mm"})
_GGUF_AUDIO_PREFIX = "a"

# hc_head: DeepSeek-V4's hyper-connection head (modeling_deepseek_v4.py DeepseekV4HyperHead: hc_fn, hc_base,
# hc_scale mix the streams before the final norm), counted with the norms as spec/params.py does
_NORM_SEGMENTS = frozenset(
    {"ln_f", "ln_1", "ln_2", "ln_attn", "ln_mlp", "ln1", "ln2", "ln", "enorm", "hnorm", "hc_head"}
)

_SHARED_EXPERT_SEGMENTS = frozenset({"shared_expert", "shared_experts", "shared_expert_gate", "shared_mlp"})
_ROUTER_SEGMENTS = frozenset({"router", "ffn_gate_inp", "exp_probs_b", "e_score_correction_bias"})
# ``mlp.gate`` is the router of Qwen-MoE / DeepSeek / OLMoE; ``block_sparse_moe.gate`` that of Mixtral.
_MOE_CONTAINERS = frozenset({"mlp", "block_sparse_moe", "feed_forward", "moe", "ffn"})
_EXPERT_SEGMENTS = frozenset({"experts", "block_sparse_moe"})

_LM_HEAD_SEGMENTS = frozenset({"lm_head", "embed_out", "output_layer"})
_POSITION_SEGMENTS = frozenset({"wpe", "embed_positions", "position_embd", "position_embeddings"})
# OPT-350m's project_in/out; Gemma 3n's per-layer embedding table, its projection and the AltUp stream
# projections (Gemma3nTextModel; GGUF per_layer_token_embd), counted apart from the token embedding
_EMBEDDING_EXTRA_SEGMENTS = frozenset(
    {
        "project_in",
        "project_out",
        "per_layer_token_embd",
        "embed_tokens_per_layer",
        "per_layer_model_projection",
        "altup_projections",
        "altup_unembed_projections",
    }
)
_EMBEDDING_SEGMENTS = frozenset(
    {
        "embed_tokens",
        "wte",
        "word_embeddings",
        "tok_embeddings",
        "embed_in",
        "token_embd",
    }
)
_ATTENTION_SEGMENTS = frozenset(
    {
        "self_attn",
        "attn",
        "attention",
        "self_attention",
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "qkv_proj",
        "c_attn",
        "query_key_value",
        "q_a_proj",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_b_proj",
        "wq",
        "wk",
        "wv",
        "wo",
        "wqkv",
        # the token mixers of recurrent layers, counted with attention (spec/params.py): gated DeltaNet
        # (Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet ``linear_attn``), LFM2's short convolution
        # (Lfm2ShortConv ``conv``)
        "linear_attn",
        "conv",
        # Mamba mixers (JambaMambaMixer ``mamba``, NemotronHMamba2Mixer ``mixer``), Gemma 3n's AltUp and
        # Laurel blocks (counted with attention by spec/params.py)
        "mamba",
        "mixer",
        "altup",
        "laurel",
        # Llama 3.2 Vision's cross-attention layers (MllamaCrossAttentionDecoderLayer: ``cross_attn`` and
        # its two tanh gates, counted with attention by spec/params.py)
        "cross_attn",
        "cross_attn_attn_gate",
        "cross_attn_mlp_gate",
    }
)
_MLP_SEGMENTS = frozenset(
    {
        "mlp",
        "feed_forward",
        "ffn",
        "c_fc",
        "fc1",
        "fc2",
        "gate_proj",
        "up_proj",
        "down_proj",
        "gate_up_proj",
        "dense_h_to_4h",
        "dense_4h_to_h",
        "per_layer_input_gate",  # Gemma 3n's per-layer input gate and projection (Gemma3nTextDecoderLayer)
        "per_layer_projection",
        "w1",
        "w2",
        "w3",
    }
)
# GGUF per-layer names: attn_q, attn_kv_a_mqa, ffn_gate_exps, ffn_down_shexp, ...
_GGUF_EXPERTS = re.compile(r"ffn_\w*_(?:exps|chexps)")
_GGUF_SHARED = re.compile(r"ffn_\w*_shexp")


def _is_norm(seg: str) -> bool:
    return "norm" in seg or seg in _NORM_SEGMENTS


# A decimal segment (layer or expert index) of a dotted name, and the layer index after a container.
_NUMBER_SEGMENT = re.compile(r"(?<![^.])[0-9]+(?![^.])")
_LAYER_INDEX = re.compile(r"(?<![^.])(?:" + "|".join(sorted(_LAYER_CONTAINERS)) + r")\.([0-9]+)(?![^.])")


def classify_tensor(name: str) -> tuple[str, int | None]:
    """``(component, layer)`` of a checkpoint tensor name, Hugging Face or GGUF style.

    The component is one of :data:`INVENTORY_COMPONENTS`; ``other`` when no rule matches (e.g. rotary
    tables such as GGUF ``rope_freqs``, which no parameter count includes). The layer is the decoder
    layer index (None outside the layer stack and for vision and audio towers).
    """
    # The rules look at which segments are numbers, never at their values, so names that differ only
    # in layer or expert index share one cached decision.
    component, in_text_stack = _component(tuple(_NUMBER_SEGMENT.sub(_NUMBER, name).split(".")))
    if not in_text_stack:
        return component, None
    m = _LAYER_INDEX.search(name)
    if m is None or len(m.group(1)) > _MAX_LAYER_DIGITS:
        return component, None
    return component, int(m.group(1))


_NUMBER = "#"
# A layer index longer than this is no decoder layer (a spec has at most MAX_LAYERS = 4096): such a tensor
# keeps its component but no layer. int() refuses digit strings over 4,300 digits (int_max_str_digits).
_MAX_LAYER_DIGITS = 9


# A checkpoint has a few hundred distinct names once indices are masked; the bound keeps a long-running
# session that opens many models from growing the cache without limit.
@functools.lru_cache(maxsize=4096)
def _component(parts: tuple[str, ...]) -> tuple[str, bool]:
    """(component, whether a layer index applies) of a name split at dots, numbers masked as ``#``."""
    segs = set(parts)
    if parts[0] == _GGUF_AUDIO_PREFIX or (parts[0] == "mm" and len(parts) > 1 and parts[1] == "a"):
        return OTHER, False
    if parts[0] in _GGUF_VISION_PREFIXES or segs & _VISION_SEGMENTS:
        return "vision", False
    if any(_is_norm(s) for s in parts):
        return "norms", True
    if segs & _SHARED_EXPERT_SEGMENTS or any(_GGUF_SHARED.fullmatch(s) for s in parts):
        return "shared_experts", True
    if segs & _ROUTER_SEGMENTS or any(
        parts[i] == "gate" and parts[i - 1] in _MOE_CONTAINERS for i in range(1, len(parts))
    ):
        return "router", True
    if (
        segs & _EXPERT_SEGMENTS
        or any(_GGUF_EXPERTS.fullmatch(s) for s in parts)
        or any(
            # per-expert GGUF tensors of early Mixtral files: blk.N.ffn_gate.E.weight
            parts[0] == "blk" and parts[i].startswith("ffn_") and parts[i + 1] == _NUMBER
            for i in range(2, len(parts) - 1)
        )
    ):
        return "routed_experts", True
    if segs & _LM_HEAD_SEGMENTS or parts[0] == "output":
        return "lm_head", True
    if segs & _POSITION_SEGMENTS:
        return "position_embedding", True
    if segs & _EMBEDDING_EXTRA_SEGMENTS:
        return "embedding_extra", True
    if segs & _EMBEDDING_SEGMENTS:
        return "embedding", True
    if segs & _ATTENTION_SEGMENTS or any(s.startswith("attn_") for s in parts):
        return "attention", True
    if segs & _MLP_SEGMENTS or any(s.startswith("ffn_") for s in parts):
        return "mlp", True
    return OTHER, True
