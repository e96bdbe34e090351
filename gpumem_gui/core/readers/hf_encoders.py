"""Readers of the encoder model types (issue 14, group encoders): BERT and RoBERTa.

The config fields and defaults are those of transformers 5.24 ``models/bert/configuration_bert.py``
``BertConfig`` and ``models/roberta/configuration_roberta.py`` ``RobertaConfig``; the modules they build are
in ``modeling_bert.py`` / ``modeling_roberta.py`` (see :mod:`gpumem_gui.core.spec.encoder_params`). The task
head comes from the config's ``architectures`` (``BertForMaskedLM`` -> masked LM) unless the caller chooses
one (:func:`gpumem_gui.core.spec.encoder.with_head`); a config that names none gets the
sequence-classification head, the usual fine-tuning target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, layer_types_explicit
from gpumem_gui.core.spec.encoder import HEAD_OF_ARCHITECTURE, EncoderSpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec field dict
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# BertSelfAttention query/key/value, BertSelfOutput.dense, BertIntermediate.dense, BertOutput.dense: the
# module names PEFT's target_modules match
_BERT_MODULES = (
    ("q_proj", "query"),
    ("k_proj", "key"),
    ("v_proj", "value"),
    ("o_proj", "dense"),
    ("up_proj", "dense"),
    ("down_proj", "dense"),
)
# ACT2FN names whose op sequence the encoder replay knows: nn.functional.gelu (GELUActivation) and its tanh
# approximation (activations.py), one output saved for backward either way
ENCODER_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def _head(r: ConfigReader) -> str:
    archs = r.get("architectures", default=None)
    if isinstance(archs, list):
        for a in archs:
            for suffix, head in HEAD_OF_ARCHITECTURE.items():
                if isinstance(a, str) and a.endswith(suffix):
                    return head
    return "sequence_classification"


def _num_labels(r: ConfigReader) -> int:
    """PreTrainedConfig: ``len(id2label)`` when the config has one, else ``num_labels`` (default 2)."""
    id2label = r.get("id2label", default=None)
    if id2label is not None:
        if not isinstance(id2label, dict) or not id2label:
            raise GpumemInputError(
                f"must map label ids to names, got {short(id2label)}", source=r.source, field="id2label"
            )
        return len(id2label)
    return r.int("num_labels", default=2)


def _probability(r: ConfigReader, key: str, default: float | None) -> float | None:
    v = r.get(key, default=default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        raise GpumemInputError(f"must be a probability in [0, 1), got {short(v)}", source=r.source, field=key)
    return float(v)


def _encoder(r: ConfigReader, name: str, mt: str, roberta: bool) -> dict[str, Any]:
    if r.bool("is_decoder", default=False) or r.bool("add_cross_attention", default=False):
        raise GpumemInputError(
            "a BERT-style decoder (causal attention, cross-attention) is not modelled; only the encoder is",
            source=r.source,
            field="is_decoder",
        )
    act = r.get("hidden_act", default="gelu")
    if act not in ENCODER_ACTIVATIONS:
        raise GpumemInputError(
            f"activation {short(act)} is not modelled for encoders; modelled: "
            f"{', '.join(ENCODER_ACTIVATIONS)}",
            source=r.source,
            field="hidden_act",
        )
    h, a = r.int("hidden_size", default=768), r.int("num_attention_heads", default=12)
    if h % a:
        raise GpumemInputError(
            f"hidden_size ({h}) is not divisible by num_attention_heads ({a})",
            source=r.source,
            field="num_attention_heads",
        )
    head = _head(r)
    tie = r.bool("tie_word_embeddings", default=True)
    positions = r.int("max_position_embeddings", default=512)
    encoder = EncoderSpec(
        head=head,  # type: ignore[arg-type]
        num_labels=_num_labels(r),
        type_vocab_size=r.int("type_vocab_size", default=2, minimum=0),
        classifier="dense" if roberta else "pooler",
        position_ids_from_input=roberta,
        classifier_dropout=_probability(r, "classifier_dropout", None),
        tie_decoder=tie,
    )
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("num_hidden_layers", default=12),
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=r.int("intermediate_size", default=3072),
        vocab_size=r.int("vocab_size", default=50265 if roberta else 30522),
        tie_word_embeddings=tie and head == "masked_lm",
        embedding_norm=True,
        position_embedding="learned",
        learned_position_rows=positions,
        max_position_embeddings=positions - 2 if roberta else positions,  # RoBERTa: ids from pad + 1
        norm="layernorm",
        norm_bias=True,
        final_norm=False,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        activation=str(act),
        encoder=encoder,
    )


def _bert(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    return _encoder(r, name, mt, roberta=False)


def _roberta(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    return _encoder(r, name, mt, roberta=True)


# DebertaV2Config values the replay models (microsoft/deberta-v3-*): anything else is refused by name
_DEBERTA_REQUIRED = (
    ("relative_attention", True, False),
    ("share_att_key", True, False),
    ("position_biased_input", False, True),
    ("legacy", True, True),
)


def _deberta(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """DebertaV2Config (models/deberta_v2/configuration_deberta_v2.py) as DeBERTa-v3 sets it: relative
    attention with shared keys over log-bucketed positions (c2p and p2c), a normed rel_embeddings table, no
    absolute positions, no token types, no conv layer, the legacy MLM head."""
    for key, want, default in _DEBERTA_REQUIRED:
        if r.bool(key, default=default) != want:
            raise GpumemInputError(
                f"only {key} = {str(want).lower()} is modelled", source=r.source, field=key
            )
    att = r.get("pos_att_type", default=None)  # "p2c|c2p" or a list (DebertaV2Config.__post_init__)
    parts = att.split("|") if isinstance(att, str) else att if isinstance(att, list) else []
    kinds = sorted(str(x).strip().lower() for x in parts)
    if kinds != ["c2p", "p2c"]:
        raise GpumemInputError(
            f"only c2p|p2c is modelled, got {short(att)}", source=r.source, field="pos_att_type"
        )
    for key, want in (("type_vocab_size", 0), ("conv_kernel_size", 0)):
        if r.int(key, default=0, minimum=0) != want:
            raise GpumemInputError(f"only {key} = {want} is modelled", source=r.source, field=key)
    if "layer_norm" not in str(r.get("norm_rel_ebd", default="none")).lower():
        raise GpumemInputError(
            "only a normed rel_embeddings is modelled", source=r.source, field="norm_rel_ebd"
        )
    if r.get("embedding_size", default=None) not in (None, r.int("hidden_size", default=768)):
        raise GpumemInputError(
            "only embedding_size = hidden_size is modelled", source=r.source, field="embedding_size"
        )
    if r.int("pooler_hidden_size", default=r.int("hidden_size", default=768)) != r.int(
        "hidden_size", default=768
    ):
        raise GpumemInputError(
            "only pooler_hidden_size = hidden_size is modelled", source=r.source, field="pooler_hidden_size"
        )
    fields = _encoder(r, name, mt, roberta=False)
    span = r.int("position_buckets", default=-1, minimum=-1)
    if span < 1:
        raise GpumemInputError(
            "only bucketed positions are modelled", source=r.source, field="position_buckets"
        )
    labels = fields["encoder"]
    fields["encoder"] = EncoderSpec(
        **{**labels.model_dump(), "type_vocab_size": 0, "block": "deberta", "relative_span": span}
    )
    fields.update(position_embedding="none", learned_position_rows=0)
    return fields


def _modern_layer_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """ModernBertConfig.__post_init__: layer i slides unless i % global_attn_every_n_layers == 0 (default 3),
    or the config's explicit layer_types."""
    explicit = layer_types_explicit(r, n)
    if explicit is not None:
        return explicit
    every = r.int("global_attn_every_n_layers", default=3)
    return tuple("sliding_attention" if i % every else "full_attention" for i in range(n))


def _modernbert(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """ModernBertConfig (models/modernbert/configuration_modernbert.py): its defaults; the sliding layers see
    tokens within local_attention // 2 on each side (ModernBertConfig.sliding_window,
    sliding_window_bidirectional_overlay)."""
    for key, default in (("hidden_activation", "gelu"), ("classifier_activation", "gelu")):
        act = r.get(key, default=default)
        if act not in ENCODER_ACTIVATIONS:
            raise GpumemInputError(
                f"activation {short(act)} is not modelled for encoders; modelled: "
                f"{', '.join(ENCODER_ACTIVATIONS)}",
                source=r.source,
                field=key,
            )
    h, a = r.int("hidden_size", default=768), r.int("num_attention_heads", default=12)
    if h % a:
        raise GpumemInputError(
            f"hidden_size ({h}) is not divisible by num_attention_heads ({a})",
            source=r.source,
            field="num_attention_heads",
        )
    n = r.int("num_hidden_layers", default=22)
    pooling = r.get("classifier_pooling", default="cls")
    if pooling not in ("cls", "mean"):
        raise GpumemInputError(
            f"must be 'cls' or 'mean', got {short(pooling)}", source=r.source, field="classifier_pooling"
        )
    head, tie = _head(r), r.bool("tie_word_embeddings", default=True)
    attention_bias = r.bool("attention_bias", default=False)
    encoder = EncoderSpec(
        head=head,  # type: ignore[arg-type]
        num_labels=_num_labels(r),
        type_vocab_size=0,
        classifier="pooler",
        classifier_dropout=_probability(r, "classifier_dropout", 0.0),
        tie_decoder=tie,
        block="modernbert",
        pooling=pooling,
        head_dense_bias=r.bool("classifier_bias", default=False),
        decoder_bias=r.bool("decoder_bias", default=True),
    )
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=r.int("intermediate_size", default=1152),
        vocab_size=r.int("vocab_size", default=50368),
        tie_word_embeddings=tie and head == "masked_lm",
        embedding_norm=True,
        position_embedding="rope",
        max_position_embeddings=r.int("max_position_embeddings", default=8192),
        norm="layernorm",
        norm_bias=r.bool("norm_bias", default=False),
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=r.bool("mlp_bias", default=False),
        mlp_gated=True,
        activation=str(r.get("hidden_activation", default="gelu")),
        layer_types=_modern_layer_types(r, n),
        sliding_window=r.int("local_attention", default=128, minimum=2) // 2,
        encoder=encoder,
    )


def _modern_dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """ModernBertConfig: mlp_dropout (the MLP's) and attention_dropout (probabilities and the attention
    output), 0.0 by default."""
    r = ConfigReader(cfg, source)
    return {
        "hidden_dropout": _probability(r, "mlp_dropout", 0.0),
        "attention_dropout": _probability(r, "attention_dropout", 0.0),
    }


def _dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """BertConfig / RobertaConfig: hidden_dropout_prob and attention_probs_dropout_prob, 0.1 by default."""
    r = ConfigReader(cfg, source)
    return {
        "hidden_dropout": _probability(r, "hidden_dropout_prob", 0.1),
        "attention_dropout": _probability(r, "attention_probs_dropout_prob", 0.1),
    }


# BertSelfOutput / BertOutput: dropout, then LayerNorm(x + residual) (post-norm); eager_attention_forward in
# modeling_bert.py: softmax in the activation dtype; BertEmbeddings.dropout
_ENCODER_TRAITS = {
    "norm_placement": "post",
    "eager_softmax_fp32": False,
    "residual_dropout": True,
    "embedding_dropout": True,
    "module_names": _BERT_MODULES,
}
# ModernBertEncoderLayer: pre-norm; Wqkv fused (unbind into q, k, v), Wi chunked into input and gate,
# act(input) * gate; eager softmax in fp32 cast back; one rotary table per layer type (global and local theta)
_MODERN_TRAITS = {
    "fused_qkv": True,
    "fused_gate_up": True,
    "rotary_per_layer_type": True,
    "module_names": (("qkv_proj", "Wqkv"), ("o_proj", "Wo"), ("gate_up_proj", "Wi"), ("down_proj", "Wo")),
}
READERS.update({"bert": _bert, "roberta": _roberta, "modernbert": _modernbert, "deberta-v2": _deberta})
TRAITS.update(
    {
        "bert": dict(_ENCODER_TRAITS),
        "roberta": dict(_ENCODER_TRAITS),
        "modernbert": dict(_MODERN_TRAITS),
        # DisentangledSelfAttention: query_proj / key_proj / value_proj, softmax in the activation dtype
        "deberta-v2": {
            **_ENCODER_TRAITS,
            "module_names": (
                ("q_proj", "query_proj"),
                ("k_proj", "key_proj"),
                ("v_proj", "value_proj"),
                *_BERT_MODULES[3:],
            ),
        },
    }
)
CONFIG_TRAITS.update(
    {"bert": _dropouts, "roberta": _dropouts, "modernbert": _modern_dropouts, "deberta-v2": _dropouts}
)
