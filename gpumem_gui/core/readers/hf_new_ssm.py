"""Readers of the model types issue 14 adds, group ssm: hybrids whose recurrent layers are Mamba-2 mixers
(``models/<type>/configuration_<type>.py`` fields and defaults, ``modeling_<type>.py`` traits, transformers
5.24): Nemotron-H (``NemotronHConfig``: one sub-layer per layer, Mamba-2, attention or MLP) and Jamba
(``JambaConfig``: Mamba-1 or attention, then an MLP or experts, in every layer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.readers.hf_modern import _moe
from gpumem_gui.core.spec.mamba import Mamba1Spec, Mamba2Spec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# NemotronHConfig._pattern_to_list (M, *, -; E is a MoE layer) and the names layers_block_type takes,
# old (remap_legacy_layer_types: mamba / attention) and new; gpumem's layer types for them
_PATTERN = {"M": "mamba", "*": "full_attention", "-": "mlp"}
_BLOCK_TYPES = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "full_attention",
    "full_attention": "full_attention",
    "mlp": "mlp",
}


def _nemotron_h_types(r: ConfigReader) -> tuple[str, ...]:
    """NemotronHConfig.__post_init__: ``layers_block_type`` (``layer_types``) when given, else
    ``hybrid_override_pattern``, else the class default (Mamba-2, MoE, attention, MLP). MoE layers
    (NemotronHMoE, its latent projections and grouped router) are not modelled: refused naming the field."""
    lt = r.get("layers_block_type", "layer_types", default=None)
    if lt is not None:
        field = "layers_block_type" if "layers_block_type" in r.cfg else "layer_types"
        if not isinstance(lt, list) or not lt or any(t not in _BLOCK_TYPES for t in lt):
            raise GpumemInputError(
                f"must list mamba, attention or mlp layers (moe layers are not modelled), got {short(lt)}",
                source=r.source,
                field=field,
            )
        return tuple(_BLOCK_TYPES[t] for t in lt)
    pattern = r.get("hybrid_override_pattern", default="ME*-")
    if not isinstance(pattern, str) or not pattern or any(c not in _PATTERN for c in pattern):
        raise GpumemInputError(
            f"must be a string of M (Mamba-2), * (attention) and - (MLP) layers (E, MoE, is not modelled), "
            f"got {short(pattern)}",
            source=r.source,
            field="hybrid_override_pattern",
        )
    return tuple(_PATTERN[c] for c in pattern)


def _named(r: ConfigReader, legacy: str, name: str) -> str:
    """The field NemotronHConfig.__post_init__ reads: the older ``mamba_*`` name when the file has it."""
    return legacy if r.cfg.get(legacy) is not None else name


def _mamba2(r: ConfigReader) -> Mamba2Spec:
    """NemotronHConfig's Mamba-2 fields; the older names (mamba_n_groups, mamba_d_conv, mamba_chunk_size,
    mamba_conv_bias) win when present, as in __post_init__. ``expand`` is not read by the mixer
    (intermediate_size = mamba_num_heads * mamba_head_dim)."""
    act = r.get("mamba_hidden_act", default="silu")
    if act != "silu":
        raise GpumemInputError(
            f"must be silu (the conv's activation), got {short(act)}",
            source=r.source,
            field="mamba_hidden_act",
        )
    heads, groups = (
        r.int("mamba_num_heads", default=128),
        r.int(_named(r, "mamba_n_groups", "n_groups"), default=8),
    )
    if heads % groups:
        raise GpumemInputError(
            f"({groups}) must divide mamba_num_heads ({heads})",
            source=r.source,
            field=_named(r, "mamba_n_groups", "n_groups"),
        )
    return Mamba2Spec(
        heads=heads,
        head_dim=r.int("mamba_head_dim", default=64),
        state_size=r.int("ssm_state_size", default=128),
        groups=groups,
        conv_kernel=r.int(_named(r, "mamba_d_conv", "conv_kernel"), default=4),
        chunk_size=r.int(_named(r, "mamba_chunk_size", "chunk_size"), default=128),
        conv_bias=r.bool(_named(r, "mamba_conv_bias", "use_conv_bias"), default=True),
        proj_bias=r.bool("use_bias", default=False),
    )


def _nemotron_h(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """NemotronHConfig (class defaults): the layer count is the pattern's length (num_hidden_layers is
    ignored); NemotronHAttention has no biases (attention_bias is not read) and no rotary embedding;
    NemotronHMLP is up/down with relu2 (mlp_hidden_act) and mlp_bias; NemotronHRMSNorm everywhere."""
    types = _nemotron_h_types(r)
    h = r.int("hidden_size", default=4096)
    act = str(r.get("mlp_hidden_act", default="relu2"))
    if act not in ("relu2", "silu", "gelu_pytorch_tanh"):
        raise GpumemInputError(
            f"must be relu2, silu or gelu_pytorch_tanh, got {short(act)}",
            source=r.source,
            field="mlp_hidden_act",
        )
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=len(types),
        num_attention_heads=r.int("num_attention_heads", default=32),
        num_kv_heads=r.int("num_key_value_heads", default=8),
        head_dim=r.int("head_dim", default=128),
        intermediate_size=r.int("intermediate_size", default=21504),
        vocab_size=r.int("vocab_size", default=131072),
        max_position_embeddings=r.int("max_position_embeddings", default=4096),
        activation=act,
        mlp_gated=False,
        mlp_bias=r.bool("mlp_bias", default=False),
        position_embedding="none",
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        layer_types=types,
        norms_per_layer=1,
        mamba=_mamba2(r) if "mamba" in types else None,
    )


READERS["nemotron_h"] = _nemotron_h
# NemotronHBlock: one norm and one mixer per layer (norms_per_layer 1); NemotronHRMSNorm multiplies the
# weight in fp32, (weight.float() * states).to(dtype), as GptOssRMSNorm; NemotronHForCausalLM upcasts the
# logits (.float()); llama.cpp LLM_ARCH_NEMOTRON_H ("nemotron_h")
TRAITS["nemotron_h"] = {
    "block": "single",
    "norm_product_fp32": True,
    "logits_float": True,
    "gguf_arch": "nemotron_h",
    "vllm_ssm_state_fp32": True,  # vLLM NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype
}


def _period(r: ConfigReader, period: str, offset: str, defaults: tuple[int, int], n: int) -> tuple[int, ...]:
    """The layers i with ``i % period == offset`` (JambaConfig.layers_block_type / layers_num_experts)."""
    p = r.int(period, default=defaults[0])
    o = r.int(offset, default=defaults[1], minimum=0)
    if o >= p:
        raise GpumemInputError(f"({o}) must be below {period} ({p})", source=r.source, field=offset)
    return tuple(i for i in range(n) if i % p == o)


def _jamba(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """JambaConfig (class defaults): attention where i % attn_layer_period == attn_layer_offset (8, 4),
    JambaMambaMixer elsewhere; JambaSparseMoeBlock where i % expert_layer_period == expert_layer_offset
    (2, 1) when num_experts > 1, JambaMLP elsewhere. JambaAttention: no biases, no rotary embedding."""
    h = r.int("hidden_size", default=4096)
    n = r.int("num_hidden_layers", default=32)
    a = r.int("num_attention_heads", default=32)
    attn = _period(r, "attn_layer_period", "attn_layer_offset", (8, 4), n)
    types = tuple("full_attention" if i in attn else "mamba" for i in range(n))
    ffn = r.int("intermediate_size", default=14336)
    rank = r.get("mamba_dt_rank", default="auto")
    if rank == "auto":
        rank = -(-h // 16)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise GpumemInputError(
            f"must be a positive integer or 'auto', got {short(rank)}", source=r.source, field="mamba_dt_rank"
        )
    act = r.get("hidden_act", default="silu")
    if act != "silu":
        raise GpumemInputError(
            f"must be silu (the conv's and the MLP's activation), got {short(act)}",
            source=r.source,
            field="hidden_act",
        )
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=8),
        head_dim=h // a,
        intermediate_size=ffn,
        vocab_size=r.int("vocab_size", default=65536),
        max_position_embeddings=r.int("max_position_embeddings", default=262144),
        position_embedding="none",
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        layer_types=types,
    )
    if "mamba" in types:
        f["mamba"] = Mamba1Spec(
            inner=r.int("mamba_expand", default=2) * h,
            state_size=r.int("mamba_d_state", default=16),
            conv_kernel=r.int("mamba_d_conv", default=4),
            dt_rank=rank,
            conv_bias=r.bool("mamba_conv_bias", default=True),
            proj_bias=r.bool("mamba_proj_bias", default=False),
        )
    if r.int("num_experts", default=16) > 1:
        sparse = _period(r, "expert_layer_period", "expert_layer_offset", (2, 1), n)
        dense = tuple(i for i in range(n) if i not in sparse)
        f["moe"] = _moe(r, "num_experts", expert_intermediate_size=ffn, dense_layers=dense)
    return f


READERS["jamba"] = _jamba
# JambaTopKRouter: fp32 softmax, top-k weights not renormalised, cast back; llama.cpp LLM_ARCH_JAMBA ("jamba")
TRAITS["jamba"] = {"router_renormalize": False, "gguf_arch": "jamba"}
