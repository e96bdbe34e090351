"""The reader of last resort: a config whose ``model_type`` no reader describes, read as a generic decoder.

When :data:`~gpumem_gui.core.readers.hf_config.READERS` has no entry for a config's ``model_type``, this
module reads the fields every decoder config carries (hidden size, layers, heads, MLP width, vocabulary;
under the common aliases, and inside ``text_config`` for wrapped multimodal checkpoints) and describes the
model as transformers' Llama decoder (``models/llama/modeling_llama.py``: ``LlamaDecoderLayer`` with a gated
MLP, RMSNorm, rotary positions), with a mixture of experts or latent attention when the config names them in
the DeepSeek / Qwen-MoE spellings. A wrapper whose ``text_config`` is of a known type is read by that type's
reader. The spec says so in :attr:`ModelSpec.approximate`; every front end shows that reason and points to
``gpumem trace``, which runs the real modeling code. Weights read from ``.safetensors`` headers stay exact
(the loader's inventory wins over formulas); the activation and KV parts are the Llama replay's.

Refused, with one line naming the field (:class:`NotModelled`): configs without the standard fields, configs
whose layers keep recurrent state (Mamba/SSM layers, linear attention, short convolutions: a fixed state per
sequence that a generic decoder would miss, and layer layouts that are not all attention), and
encoder-decoders. Trace mode still measures those (the loader keeps their config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, layer_types_explicit, positive_number
from gpumem_gui.core.readers.traits import traits_for
from gpumem_gui.core.spec.model import MLASpec, MoESpec

Reader = Callable[[ConfigReader, str, str], dict[str, Any]]

TRACE_POINTER = "`gpumem trace` (the window: Tools > Verify exactly) measures it exactly"

# The standard fields and the spellings of them this reader accepts, first present wins. Sources (transformers
# 5.24 configuration classes unless said otherwise): hidden_size/num_hidden_layers/num_attention_heads/
# intermediate_size/vocab_size LlamaConfig; n_embd/n_layer/n_head/n_inner GPT2Config, GPTJConfig; d_model/
# n_layers/n_heads MptConfig; ffn_dim OPTConfig; num_layers/ffn_hidden_size/padded_vocab_size ChatGLMConfig
# (THUDM/chatglm3-6b configuration_chatglm.py, remote code); num_heads T5Config and Mamba2Config (the latter
# refused below for its state); n_vocab the original Qwen (Qwen/Qwen-7B configuration_qwen.py).
STANDARD: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size", "padded_vocab_size", "n_vocab"),
}
# num_key_value_heads LlamaConfig; num_kv_heads FalconConfig; n_head_kv Falcon's first RWConfig
# (tiiuae/falcon-7b configuration_RW.py); multi_query_group_num ChatGLMConfig
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
HEAD_DIM = ("head_dim", "kv_channels")  # LlamaConfig head_dim; ChatGLMConfig kv_channels
# LlamaConfig max_position_embeddings; GPT2Config n_positions; MptConfig max_seq_len; ChatGLMConfig seq_length
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
# routed experts: Qwen2MoeConfig num_experts, MixtralConfig num_local_experts, DeepseekV3Config
# n_routed_experts, Ernie4_5_MoeConfig moe_num_experts; top-k: num_experts_per_tok (all of them), moe_k
# (Ernie4_5_MoeConfig)
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_k")
EXPERT_WIDTH = ("moe_intermediate_size", "expert_intermediate_size")
FIRST_DENSE = ("first_k_dense_replace", "num_dense_layers")  # DeepseekV3Config, Lfm2MoeConfig

# Fields that describe recurrent state (transformers 5.24 configs of hybrid and state-space models): the
# prefixes cover JambaConfig / BambaConfig / FalconH1Config / GraniteMoeHybridConfig (mamba_*),
# NemotronHConfig and FalconH1Config (ssm_*), Qwen3NextConfig / Qwen3_5Config / KimiLinearConfig /
# OlmoHybridConfig / MiniMaxConfig (linear_*), BailingHybridConfig (short_conv_*), Lfm2Config (conv_L_cache),
# MambaConfig / Mamba2Config (time_step_*, state_size); the keys ZambaConfig / NemotronHConfig
# (layers_block_type), RecurrentGemmaConfig (block_types), NemotronH's published configs
# (hybrid_override_pattern), Zamba2Config (hybrid_layer_ids), JambaConfig / ZambaConfig (attn_layer_period),
# BambaConfig (attn_layer_indices), Lfm2Config (full_attn_idxs).
RECURRENT_PREFIXES = ("mamba_", "ssm_", "linear_", "short_conv", "conv_L_cache", "time_step_")
RECURRENT_KEYS = (
    "layers_block_type",
    "block_types",
    "hybrid_override_pattern",
    "hybrid_layer_ids",
    "attn_layer_period",
    "attn_layer_indices",
    "full_attn_idxs",
    "state_size",
)
# model types of transformers 5.24 whose layers keep such state (their default configs carry the fields
# above, or layer_types other than full/sliding attention), refused by name too: a config of one of them
# that happens to carry the standard fields is still not a Llama
RECURRENT_TYPES = frozenset(
    (
        "bailing_hybrid", "bamba", "falcon_h1", "falcon_mamba", "glm5_next", "granitemoehybrid",
        "jamba", "jev", "kimi_linear", "lara_mini", "lfm2", "lfm2_moe", "lfm2_vl", "lfm3",
        "lfm3_vl", "mamba", "mamba2", "minicpmv4_6", "minicpmv4_7", "minimax", "nemotron_h",
        "nemotron_h_omni", "olmo_hybrid", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text",
        "qwen3_5_text", "qwen3_next", "qwen4_exp", "recurrent_gemma", "rwkv", "xlstm", "zamba",
        "zamba2", "zaya",
    )
)  # fmt: skip
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention"})


class NotModelled(GpumemInputError):
    """A config of a ``model_type`` no reader describes that the generic decoder cannot stand in for; the
    loader keeps such a config for trace mode (``unknown_architecture_ok``)."""


def _refuse(mt: str, why: str, source: str, field: str) -> NotModelled:
    return NotModelled(
        f"model_type {short(mt)} is not supported (architecture not modelled): {why}; `gpumem trace` "
        "measures it, and .safetensors headers give its exact weight sizes",
        source=source,
        field=field,
    )


def _recurrent_field(cfg: Mapping[str, Any]) -> str | None:
    for k, v in cfg.items():
        if v is None or v is False:
            continue
        if k in RECURRENT_KEYS or k.startswith(RECURRENT_PREFIXES):
            return k
    return None


def _check_decoder(cfg: Mapping[str, Any], mt: str, source: str, named: str | None) -> None:
    """Refuse what a generic decoder estimate would get wrong: recurrent state, non-attention layers.
    ``named``: the model_type the config itself carries (a text_config's own), checked against the list."""
    if cfg.get("is_encoder_decoder") is True:
        raise _refuse(mt, "an encoder-decoder, not a decoder", source, "is_encoder_decoder")
    key = _recurrent_field(cfg)
    if key is not None:
        raise _refuse(
            mt,
            f"{short(key)} describes recurrent state (SSM, linear attention or convolution) that a generic "
            "decoder estimate would miss",
            source,
            key,
        )
    for key in ("compress_ratios", "compress_rates"):  # DeepseekV4Config (CSA / HCA layers)
        if cfg.get(key) is not None:
            raise _refuse(
                mt,
                f"{key} describes compressed attention, whose cache grows by a rule of the length "
                "(spec/compressed.py), not by a per-token figure",
                source,
                key,
            )
    lt = cfg.get("layer_types")
    if isinstance(lt, list):
        other = sorted({str(t) for t in lt} - ATTENTION_LAYERS)
        if other:
            raise _refuse(
                mt,
                f"layer_types names {', '.join(short(t, 30) for t in other[:3])} layers, which a generic "
                "decoder (full and sliding attention only) does not model",
                source,
                "layer_types",
            )
    if named in RECURRENT_TYPES:
        raise _refuse(
            mt, "its layers keep recurrent state (SSM, linear attention or convolution)", source, "model_type"
        )


def _standard_missing(cfg: Mapping[str, Any]) -> str | None:
    """The first standard field the config lacks under every spelling (GPT-2's ``n_inner: null`` means
    4 x hidden, GPT2Block's inner_dim)."""
    for field, names in STANDARD.items():
        if any(cfg.get(n) is not None for n in names):
            continue
        if field == "intermediate_size" and "n_inner" in cfg:
            continue
        return field
    return None


def _text_part(cfg: Mapping[str, Any], source: str) -> tuple[Mapping[str, Any], str]:
    """The config the decoder is read from: a ``text_config`` (multimodal wrappers: LlavaConfig,
    Mistral3Config, Qwen2_5_VLConfig ...) when the top level lacks the standard fields."""
    text = cfg.get("text_config")
    if _standard_missing(cfg) is None or text is None:
        return cfg, source
    if not isinstance(text, Mapping):
        raise GpumemInputError("must be an object", source=source, field="text_config")
    return text, f"{source} (text_config)"


def _kv_heads(r: ConfigReader, heads: int) -> int:
    if r.cfg.get("multi_query") is True:  # GPTBigCodeConfig multi_query: one K/V head
        return 1
    if r.cfg.get("multi_query_attention") is False:  # ChatGLMConfig: group count unused without it
        return heads
    return r.int(*KV_HEADS, default=heads)


def _moe(r: ConfigReader, mt: str, layers: int, width: int) -> MoESpec | None:
    experts = r.opt_int(*EXPERTS, minimum=0)
    if experts is None or experts < 2:
        return None
    if r.opt_int(*TOP_K) is None:
        raise _refuse(mt, f"{experts} experts but no top-k", r.source, TOP_K[0])
    top_k = r.int(*TOP_K)
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts", source=r.source, field=TOP_K[0]
        )
    expert_width = r.int(*EXPERT_WIDTH, default=width)
    # the shared expert: Qwen2MoeConfig shared_expert_intermediate_size, DeepseekV3Config n_shared_experts
    # experts of moe_intermediate_size
    shared = r.int("shared_expert_intermediate_size", default=0, minimum=0)
    shared = shared or r.int("n_shared_experts", "num_shared_experts", default=0, minimum=0) * expert_width
    first = r.int(*FIRST_DENSE, default=0, minimum=0)
    only = r.get("mlp_only_layers", default=[])  # Qwen2MoeConfig: layers that keep a dense MLP
    only = {i for i in only if isinstance(i, int)} if isinstance(only, list) else set()
    kinds = r.get("mlp_layer_types", default=None)  # e.g. ["dense", "sparse", ...] (Step3p5Config)
    dense_kind = {i for i, k in enumerate(kinds) if k == "dense"} if isinstance(kinds, list) else set()
    # Qwen2MoeConfig decoder_sparse_step: experts when (i + 1) % step == 0; DeepseekV2Config moe_layer_freq:
    # experts when i % freq == 0
    step = r.int("decoder_sparse_step", default=1)
    freq = r.int("moe_layer_freq", default=1)
    dense = tuple(
        i for i in range(layers) if i < first or i in only or i in dense_kind or (i + 1) % step or i % freq
    )
    return MoESpec(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_width,
        shared_expert_intermediate_size=shared,
        dense_layers=dense,
    )


def _mla(r: ConfigReader) -> MLASpec | None:
    """DeepSeek-V2/V3's latent attention when the config spells all of it (DeepseekV3Config's fields)."""
    if r.opt_int("kv_lora_rank") is None:
        return None
    return MLASpec(
        q_lora_rank=r.opt_int("q_lora_rank"),
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
    )


def _decoder(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """The generic decoder's fields, with LlamaConfig's defaults (tie_word_embeddings False, attention_bias
    and mlp_bias False, hidden_act silu, max_position_embeddings 2048)."""
    h = r.int(*STANDARD["hidden_size"])
    heads = r.int(*STANDARD["num_attention_heads"])
    layers = r.int(*STANDARD["num_hidden_layers"])
    width = r.int(*STANDARD["intermediate_size"], default=4 * h)  # n_inner null: 4 x hidden (GPT2Block)
    bias = r.bool("attention_bias", default=False)
    mla = _mla(r)
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=heads if mla else _kv_heads(r, heads),
        head_dim=mla.qk_head_dim if mla else r.int(*HEAD_DIM, default=None) or r.head_dim(h, heads),
        intermediate_size=width,
        vocab_size=r.int(*STANDARD["vocab_size"]),
        max_position_embeddings=r.int(*MAX_POSITIONS, default=2048),
        activation=str(r.get("hidden_act", "activation_function", "hidden_activation", default="silu")),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=r.bool("mlp_bias", default=False),
        mla=mla,
        moe=_moe(r, mt, layers, width),
    )
    cap = r.get("final_logit_softcapping", default=None)  # Gemma2Config's: logits = cap * tanh(logits / cap)
    f["final_logit_softcapping"] = positive_number(cap, r.source, "final_logit_softcapping") if cap else None
    f["layer_types"] = layer_types_explicit(r, layers) or ()
    f["sliding_window"] = r.opt_int("sliding_window") if "sliding_attention" in f["layer_types"] else None
    return f


def _reason(mt: str, f: Mapping[str, Any], cfg: Mapping[str, Any], text_type: str | None) -> str:
    if text_type is not None:
        what = f"read as its text model ({short(text_type)})"
    else:
        kinds = [k for k, on in (("experts", f.get("moe")), ("latent attention", f.get("mla"))) if on]
        what = "estimated as a generic Llama-like decoder (gated MLP, RMSNorm, rotary positions" + (
            f", {', '.join(kinds)})" if kinds else ")"
        )
    extra = ""
    towers = sorted(
        k for k in cfg if k.endswith("_config") and k != "text_config" and isinstance(cfg[k], dict)
    )
    if towers:
        extra += f"; {', '.join(towers)} not counted (the .safetensors headers count its weights)"
    if cfg.get("sliding_window") and not f.get("layer_types"):
        extra += "; sliding_window ignored without layer_types (every layer full attention, the larger cache)"
    return f"architecture not modelled: model_type {short(mt)} {what}{extra}; {TRACE_POINTER}"


def generic_fields(
    cfg: Mapping[str, Any], mt: str, name: str, source: str, readers: Mapping[str, Reader]
) -> dict[str, Any]:
    """The :class:`ModelSpec` fields of a config of an unknown ``model_type`` (with ``traits`` and
    ``approximate``), or :class:`NotModelled` naming what rules the generic decoder out. ``readers`` is the
    table of known types: a wrapper whose ``text_config`` is of a known type is read by that type's reader."""
    text, where = _text_part(cfg, source)
    text_type = text.get("model_type") if text is not cfg else None
    known = isinstance(text_type, str) and text_type in readers
    missing = None if known else _standard_missing(text)
    if missing is not None:
        spellings = ", ".join(STANDARD[missing][1:])
        why = f"the config has no {missing} (nor {spellings}) for a generic decoder estimate"
        raise _refuse(mt, why, where, missing)
    _check_decoder(cfg, mt, source, mt)
    if text is not cfg:
        _check_decoder(text, mt, where, None if known else str(text_type))
    r = ConfigReader(text, where)
    if known:
        f = readers[text_type](r, name, text_type)
        f["traits"] = traits_for(text_type, text, where)
    else:
        text_type = None
        f = _decoder(r, name, mt)
        f["traits"] = traits_for(mt, text, where)
    f["model_type"] = mt
    f["approximate"] = _reason(mt, f, cfg, text_type)
    return f
