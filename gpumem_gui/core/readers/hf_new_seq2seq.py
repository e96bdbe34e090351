"""Readers of the encoder-decoder model types (issue 14, group seq2seq): T5 (original relu and v1.1
gated-gelu), mT5, UMT5, BART and mBART (mBART-50 too: model_type mbart).

The config fields and defaults are those of transformers 5.24 ``models/t5/configuration_t5.py`` ``T5Config``,
``models/mt5/configuration_mt5.py`` ``MT5Config``, ``models/umt5/configuration_umt5.py`` ``UMT5Config`` and
``models/bart/configuration_bart.py`` ``BartConfig`` (``models/mbart/configuration_mbart.py`` ``MBartConfig``:
the same fields and defaults);
the modules they build are in the ``modeling_*.py`` files next to them (see
:mod:`gpumem_gui.core.spec.seq2seq_params`). The spec is a :class:`~gpumem_gui.core.spec.seq2seq.Seq2SeqSpec`
on a ModelSpec whose ``num_layers`` counts both stacks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.spec.seq2seq import Seq2SeqSpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec field dict
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# T5Config / MT5Config / UMT5Config class defaults: (vocab_size, d_model, d_kv, d_ff, num_layers, num_heads,
# feed_forward_proj)
_DEFAULTS = {
    "t5": (32128, 512, 64, 2048, 6, 8, "relu"),  # configuration_t5.py T5Config
    "mt5": (250112, 512, 64, 1024, 8, 6, "gated-gelu"),  # configuration_mt5.py MT5Config
    "umt5": (250112, 512, 64, 1024, 8, 6, "gated-gelu"),  # configuration_umt5.py UMT5Config
}


def _feed_forward(r: ConfigReader, default: str) -> tuple[bool, str]:
    """T5Config.__post_init__ / validate_architecture: ``gated-{act}`` or ``{act}``; ``gated-gelu`` runs
    ``gelu_new``. Returns (gated, ACT2FN name)."""
    proj = r.get("feed_forward_proj", default=default)
    parts = proj.split("-") if isinstance(proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or not all(parts):
        raise GpumemInputError(
            f"must be 'gated-{{act}}' or '{{act}}' (e.g. 'relu', 'gated-gelu'), got {short(proj)}",
            source=r.source,
            field="feed_forward_proj",
        )
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    return len(parts) == 2, act


def _t5(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    vocab, d_model, d_kv, d_ff, layers, heads, proj = _DEFAULTS[mt]
    if r.bool("is_decoder", default=False) or r.bool("is_encoder_decoder", default=True) is False:
        raise GpumemInputError(
            "only the encoder-decoder (ForConditionalGeneration) is modelled",
            source=r.source,
            field="is_decoder",
        )
    gated, act = _feed_forward(r, proj)
    enc = r.int("num_layers", default=layers)
    dec_raw = r.get("num_decoder_layers", default=None)
    dec = enc if dec_raw is None else r.int("num_decoder_layers")
    # T5Config / UMT5Config.__post_init__: scale_decoder_outputs = the config's tie_word_embeddings is not
    # False; MT5ForConditionalGeneration.forward never rescales (modeling_mt5.py)
    tie_in_file = r.get("tie_word_embeddings", default=None)
    if tie_in_file is not None and not isinstance(tie_in_file, bool):
        raise GpumemInputError(
            f"must be true or false, got {short(tie_in_file)}", source=r.source, field="tie_word_embeddings"
        )
    s2s = Seq2SeqSpec(
        encoder_layers=enc,
        decoder_layers=dec,
        relative_attention_num_buckets=r.int("relative_attention_num_buckets", default=32),
        relative_attention_max_distance=r.int("relative_attention_max_distance", default=128),
        bias_every_layer=mt == "umt5",
        scale_decoder_outputs=mt != "mt5" and tie_in_file is not False,
    )
    heads_n = r.int("num_heads", default=heads)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=r.int("d_model", default=d_model),
        num_layers=enc + dec,
        num_attention_heads=heads_n,
        num_kv_heads=heads_n,
        head_dim=r.int("d_kv", default=d_kv),
        intermediate_size=r.int("d_ff", default=d_ff),
        vocab_size=r.int("vocab_size", default=vocab),
        # T5Config / MT5Config / UMT5Config.__post_init__ force tie_word_embeddings = True
        tie_word_embeddings=True,
        position_embedding="none",
        # relative positions: no table limits the length (n_positions is informational)
        max_position_embeddings=r.int("n_positions", default=512),
        norm="rmsnorm",
        norm_bias=False,
        norms_per_layer=2,
        final_norm=True,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        mlp_gated=gated,
        activation=act,
        seq2seq=s2s,
    )


def _probability(cfg: Mapping[str, Any], source: str, key: str, default: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        raise GpumemInputError(f"must be a probability in [0, 1), got {short(v)}", source=source, field=key)
    return float(v)


def _module_names(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """T5Attention q/k/v/o; T5DenseActDense wi/wo or T5DenseGatedActDense wi_0 (gate), wi_1 (up), wo: the
    module names PEFT's target_modules match."""
    gated = str(cfg.get("feed_forward_proj", "relu")).startswith("gated-")
    return {
        "module_names": (
            ("q_proj", "q"),
            ("k_proj", "k"),
            ("v_proj", "v"),
            ("o_proj", "o"),
            ("gate_proj", "wi_0"),
            ("up_proj", "wi_1" if gated else "wi"),
            ("down_proj", "wo"),
        )
    }


def _t5_traits(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The module names and T5Config.dropout_rate: every nn.Dropout of the model and the attention
    probabilities' (T5Attention.dropout)."""
    p = _probability(cfg, source, "dropout_rate", 0.1)
    return {**_module_names(cfg, source), "hidden_dropout": p, "attention_dropout": p}


def _mt5_traits(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    return _t5_traits({"feed_forward_proj": "gated-gelu", **cfg}, source)


def _same(r: ConfigReader, key: str, default: int) -> int:
    """BartConfig's ``encoder_{key}`` and ``decoder_{key}``: one value for both stacks (the ModelSpec's)."""
    enc = r.int(f"encoder_{key}", default=default)
    if r.int(f"decoder_{key}", default=default) != enc:
        raise GpumemInputError(
            f"must equal encoder_{key} ({enc}): stacks of different widths are not modelled",
            source=r.source,
            field=f"decoder_{key}",
        )
    return enc


def _bart(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """BartConfig (defaults: bart-large's dimensions): BartForConditionalGeneration, post-norm blocks with
    biases everywhere, learned positions (offset 2) and ``layernorm_embedding`` per stack."""
    if r.bool("is_decoder", default=False) or r.bool("is_encoder_decoder", default=True) is False:
        raise GpumemInputError(
            "only the encoder-decoder (BartForConditionalGeneration) is modelled",
            source=r.source,
            field="is_decoder",
        )
    for key in ("encoder_layerdrop", "decoder_layerdrop"):  # BartEncoder.forward: torch.rand per layer
        if r.get(key, default=0.0) not in (0, 0.0, None):
            raise GpumemInputError("LayerDrop is not modelled; set it to 0.0", source=r.source, field=key)
    heads = _same(r, "attention_heads", 16)
    hidden = r.int("d_model", default=1024)
    if hidden % heads:
        raise GpumemInputError(
            f"must divide d_model ({hidden})", source=r.source, field="encoder_attention_heads"
        )
    enc, dec = r.int("encoder_layers", default=12), r.int("decoder_layers", default=12)
    positions = r.int("max_position_embeddings", default=1024)
    act = r.get("activation_function", default="gelu")
    return dict(
        name=name,
        model_type=mt,
        hidden_size=hidden,
        num_layers=enc + dec,
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=_same(r, "ffn_dim", 4096),
        vocab_size=r.int("vocab_size", default=50265),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
        position_embedding="learned",
        learned_position_rows=positions + 2,  # BartLearnedPositionalEmbedding: offset 2
        max_position_embeddings=positions,
        norm="layernorm",
        norm_bias=True,
        norms_per_layer=2,
        final_norm=False,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        activation=act if isinstance(act, str) else "gelu",
        seq2seq=Seq2SeqSpec(
            encoder_layers=enc,
            decoder_layers=dec,
            block="bart",
            scale_decoder_outputs=False,
            embed_scale=r.bool("scale_embedding", default=False),
            # BartConfig.activation_dropout: after the feed-forward activation (the run's dropout leaves it)
            activation_dropout=_probability(r.cfg, r.source, "activation_dropout", 0.0),
        ),
    )


def _mbart(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """MBartConfig (the same fields and defaults as BartConfig: configuration_mbart.py): BART's layers with
    the norm before each sub-layer and a final LayerNorm per stack (modeling_mbart.py)."""
    f = _bart(r, name, mt)
    f["seq2seq"] = f["seq2seq"].model_copy(update={"pre_norm": True})
    return f


def _bart_traits(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """BartConfig.dropout (hidden states) and attention_dropout (probabilities); the module names PEFT's
    target_modules match (BartAttention out_proj, the layers' fc1 and fc2)."""
    return {
        "hidden_dropout": _probability(cfg, source, "dropout", 0.1),
        "attention_dropout": _probability(cfg, source, "attention_dropout", 0.0),
        "module_names": (("o_proj", "out_proj"), ("up_proj", "fc1"), ("down_proj", "fc2")),
    }


READERS.update({"t5": _t5, "mt5": _t5, "umt5": _t5, "bart": _bart, "mbart": _mbart})
# T5LayerNorm: RMSNorm without bias, the variance in fp32 (pre-norm blocks, like Llama's)
TRAITS.update({"t5": {}, "mt5": {}, "umt5": {}, "bart": {}, "mbart": {}})
CONFIG_TRAITS.update(
    {"t5": _t5_traits, "mt5": _mt5_traits, "umt5": _mt5_traits, "bart": _bart_traits, "mbart": _bart_traits}
)
