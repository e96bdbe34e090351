"""Readers of the model types issue 14 adds, group ssm, whose mixers derive from ``BambaMixer`` (Mamba-2 with
the ``mamba_*`` fields; ``models/<type>/configuration_<type>.py`` fields and defaults, ``modeling_<type>.py``
traits, transformers 5.24): Granite 4.0 (``GraniteMoeHybridConfig``: a Mamba-2 mixer or attention, then
experts plus a shared MLP, in every layer) and Falcon-H1 (``FalconH1Config``: a Mamba-2 mixer and attention
side by side in every layer, with muP multipliers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.readers.hf_modern import _moe
from gpumem_gui.core.spec.mamba import Mamba2Spec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}


def _bamba_mamba2(r: ConfigReader, inner: int) -> Mamba2Spec:
    """The ``mamba_*`` fields of the Bamba-derived mixers (GraniteMoeHybridMambaLayer, FalconH1Mixer:
    ``BambaMixer.__init__``); ``mamba_d_head`` "auto" is ``inner // mamba_n_heads`` (the configs'
    __post_init__) and validate_architecture requires heads x head_dim == inner."""
    heads, groups = r.int("mamba_n_heads", default=128), r.int("mamba_n_groups", default=1)
    hd = r.get("mamba_d_head", default="auto")
    head_dim = inner // heads if hd == "auto" else r.int("mamba_d_head")
    if heads * head_dim != inner:
        raise GpumemInputError(
            f"x mamba_n_heads ({head_dim} x {heads}) must equal the mixer's width ({inner})",
            source=r.source,
            field="mamba_d_head",
        )
    if heads % groups:
        raise GpumemInputError(
            f"({groups}) must divide mamba_n_heads ({heads})", source=r.source, field="mamba_n_groups"
        )
    return Mamba2Spec(
        heads=heads,
        head_dim=head_dim,
        state_size=r.int("mamba_d_state", default=256),
        groups=groups,
        conv_kernel=r.int("mamba_d_conv", default=4),
        chunk_size=r.int("mamba_chunk_size", default=256),
        conv_bias=r.bool("mamba_conv_bias", default=True),
        proj_bias=r.bool("mamba_proj_bias", default=False),
    )


def _silu(r: ConfigReader) -> str:
    """``hidden_act``: the conv's activation (``BambaMixer.activation``) and the MLPs'; only silu is run."""
    act = r.get("hidden_act", default="silu")
    if act != "silu":
        raise GpumemInputError(
            f"must be silu (the Mamba conv's and the MLP's activation), got {short(act)}",
            source=r.source,
            field="hidden_act",
        )
    return act


# GraniteMoeHybridConfig.layer_types (remap_legacy_layer_types: mamba -> linear_attention, attention ->
# full_attention); gpumem's layer types for them
_GRANITE_TYPES = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "full_attention",
    "full_attention": "full_attention",
}


def _granite_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """GraniteMoeHybridConfig.__post_init__: ``layer_types`` (default: every layer Mamba-2)."""
    lt = r.get("layer_types", "layers_block_type", default=["mamba"] * n)
    if not isinstance(lt, list) or len(lt) != n or any(t not in _GRANITE_TYPES for t in lt):
        raise GpumemInputError(
            f"must list {n} layers (num_hidden_layers), each mamba or attention, got {short(lt)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(_GRANITE_TYPES[t] for t in lt)


def _granitemoehybrid(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """GraniteMoeHybridConfig (class defaults): GraniteMoeHybridDecoderLayer holds a Mamba-2 mixer or
    attention (GraniteMoeHybridAttention: head_dim hidden / heads, attention_bias on q/k/v/o, rotary only
    with position_embedding_type "rope"), then GraniteMoeHybridMoE (num_local_experts > 0) plus the shared
    MLP (input_linear to 2 x shared_intermediate_size, output_linear), or the shared MLP alone."""
    h, n = r.int("hidden_size", default=4096), r.int("num_hidden_layers", default=32)
    a = r.int("num_attention_heads", default=32)
    types = _granite_types(r, n)
    pe = r.get("position_embedding_type", default="none")
    experts = r.int("num_local_experts", default=8, minimum=0)
    shared = r.int("shared_intermediate_size", default=1024)
    bias = r.bool("attention_bias", default=False)
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=a),
        head_dim=r.head_dim(h, a),
        intermediate_size=shared if experts == 0 else r.int("intermediate_size", default=11008),
        vocab_size=r.int("vocab_size", default=32000),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        activation=_silu(r),
        qkv_bias=bias,
        o_bias=bias,
        position_embedding="rope" if pe == "rope" else "none",
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        layer_types=types,
    )
    mamba = _bamba_mamba2(r, r.int("mamba_expand", default=2) * h)  # validate_architecture: always checked
    if "mamba" in types:
        f["mamba"] = mamba
    if experts:
        f["moe"] = _moe(
            r,
            "num_local_experts",
            expert_intermediate_size=f["intermediate_size"],
            shared_expert_intermediate_size=shared,
        )
    return f


READERS["granitemoehybrid"] = _granitemoehybrid
# GraniteMoeHybridModel: inputs_embeds * embedding_multiplier (a new tensor); GraniteMoeHybridDecoderLayer:
# residual + out * residual_multiplier after each sub-layer; GraniteMoeHybridForCausalLM: logits /
# logits_scaling (a new tensor); GraniteMoeHybridTopKRouter (logits .float(), softmax over the top-k, cast
# back) is replayed as TopKRouter's ([tokens, experts]-sized tensors either way); llama.cpp
# LLM_ARCH_GRANITE_HYBRID ("granitehybrid")
TRAITS["granitemoehybrid"] = {
    "embedding_scale": True,
    "residual_scaled": True,
    "logits_scaled": True,
    "fused_gate_up": True,  # GraniteMoeHybridMLP (the shared MLP): one input_linear chunked into gate and up
    "gguf_arch": "granitehybrid",
}


def _falcon_h1_mamba(r: ConfigReader, h: int) -> Mamba2Spec:
    """FalconH1Mixer: BambaMixer's fields with the width ``mamba_d_ssm`` (else mamba_expand x hidden_size);
    the gated RMSNorm only with ``mamba_rms_norm`` (FalconH1RMSNormGated, norm_before_gate false: the
    gate multiplies before the norm, as NemotronHRMSNormGated); out_proj's bias is ``projectors_bias``."""
    inner = r.opt_int("mamba_d_ssm") or r.int("mamba_expand", default=2) * h
    spec = _bamba_mamba2(r, inner)
    rms = r.bool("mamba_rms_norm", default=False)
    if rms and r.bool("mamba_norm_before_gate", default=True):
        raise GpumemInputError(
            "true with mamba_rms_norm is not modelled (the norm before the gate); only false is",
            source=r.source,
            field="mamba_norm_before_gate",
        )
    if r.bool("projectors_bias", default=False) != spec.proj_bias:
        raise GpumemInputError(
            f"must equal mamba_proj_bias ({spec.proj_bias}): one bias setting for in_proj and out_proj is "
            "modelled",
            source=r.source,
            field="projectors_bias",
        )
    return spec.model_copy(update={"gated_norm": rms, "mup": True})


def _falcon_h1(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """FalconH1Config (class defaults): every layer is "hybrid" (layers_block_type): FalconH1Mixer and
    FalconH1Attention (LlamaAttention: head_dim, attention_bias, rotary) side by side, then FalconH1MLP
    (LlamaMLP: gated, mlp_bias)."""
    h, n = r.int("hidden_size", default=4096), r.int("num_hidden_layers", default=32)
    a = r.int("num_attention_heads", default=32)
    bias = r.bool("attention_bias", default=False)
    for field in ("mlp_multipliers", "ssm_multipliers"):
        v, k = r.get(field, default=None), 2 if field == "mlp_multipliers" else 5
        if v is not None and (not isinstance(v, list) or len(v) != k):
            raise GpumemInputError(f"must list {k} numbers, got {short(v)}", source=r.source, field=field)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=8),
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("intermediate_size", default=14336),
        vocab_size=r.int("vocab_size", default=128000),
        max_position_embeddings=r.int("max_position_embeddings", default=8192),
        activation=_silu(r),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=r.bool("mlp_bias", default=False),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        layer_types=("hybrid",) * n,
        mamba=_falcon_h1_mamba(r, h),
    )


READERS["falcon_h1"] = _falcon_h1
# FalconH1Model: embed_tokens(ids) * embedding_multiplier; FalconH1ForCausalLM: lm_head(h) *
# lm_head_multiplier (new tensors); FalconH1Attention: keys * key_multiplier; llama.cpp LLM_ARCH_FALCON_H1
TRAITS["falcon_h1"] = {
    "block": "parallel_mamba",
    "embedding_scale": True,
    "key_scaled": True,
    "logits_scaled": True,
    "gguf_arch": "falcon-h1",
}
