"""``Seq2SeqSpec``: what makes a :class:`~gpumem_gui.core.spec.model.ModelSpec` an encoder-decoder (T5, mT5,
UMT5, BART) rather than a decoder-only model.

The ModelSpec's ordinary fields describe one block of the model (``hidden_size`` = ``d_model``, the heads,
``head_dim`` = ``d_kv``, ``intermediate_size`` = ``d_ff``, the gated or plain MLP, RMSNorm without bias); its
``num_layers`` counts every block of both stacks, the encoder's first (layers ``0 .. encoder_layers - 1``),
then the decoder's. This spec adds what those fields cannot say: where the stacks split, the relative
attention bias tables, and the decoder's cross-attention.

transformers 5.24 ``models/t5/modeling_t5.py`` ``T5ForConditionalGeneration``: a shared embedding (tied to
both stacks and to ``lm_head``: ``T5Config.__post_init__`` forces ``tie_word_embeddings = True``), an encoder
``T5Stack`` (``T5Block`` = ``T5LayerSelfAttention`` + ``T5LayerFF``, each with its ``T5LayerNorm``; the first
block's attention owns ``relative_attention_bias``), a decoder ``T5Stack`` (the same plus
``T5LayerCrossAttention`` between them, no bias table of its own), a ``final_layer_norm`` per stack.
``models/umt5/modeling_umt5.py``: every self-attention owns a bias table
(``has_relative_attention_bias=True``).

``models/bart/modeling_bart.py`` ``BartForConditionalGeneration`` (``block`` = ``bart``): the shared embedding
(tied to ``lm_head`` unless the config unties it), per stack a learned position table (max positions + 2 rows)
and ``layernorm_embedding``, post-norm layers with biases everywhere (``fc1`` / ``fc2`` as the plain MLP), no
bias table and no final norm; ``final_logits_bias`` is a buffer.

The generation cache is ``EncoderDecoderCache`` (``cache_utils.py``): a ``DynamicCache`` of the decoder's
self-attention keys and values per target token, and one of the cross-attention keys and values, computed once
from the encoder's output (source tokens) per decoder layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from gpumem_gui.core.spec.model import ModelSpec


class Seq2SeqSpec(BaseModel):
    """The split of the blocks into encoder and decoder, and T5's relative position bias."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encoder_layers: Annotated[int, Field(gt=0, le=1 << 12)] = Field(
        description="blocks of the encoder stack (T5Config.num_layers)"
    )
    decoder_layers: Annotated[int, Field(gt=0, le=1 << 12)] = Field(
        description="blocks of the decoder stack (T5Config.num_decoder_layers, default num_layers)"
    )
    block: Literal["t5", "bart"] = Field(
        "t5",
        description="t5: T5Block (pre-norm RMSNorm, relative position bias, no biases); bart: "
        "BartEncoderLayer / BartDecoderLayer (post-norm LayerNorm, biases, learned positions and "
        "layernorm_embedding per stack)",
    )
    relative_attention_num_buckets: Annotated[int, Field(gt=0, le=1 << 16)] = Field(
        32,
        description="rows of each relative_attention_bias table (nn.Embedding(num_buckets, n_heads); "
        "T5Config default 32)",
    )
    relative_attention_max_distance: Annotated[int, Field(gt=0, le=1 << 24)] = Field(
        128, description="distance beyond which all relative positions share a bucket (T5Config default 128)"
    )
    embed_scale: bool = Field(
        False, description="BartScaledWordEmbedding multiplies by sqrt(d_model) (BartConfig.scale_embedding)"
    )
    activation_dropout: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.0, description="dropout after the feed-forward activation (BartConfig.activation_dropout)"
    )
    bias_every_layer: bool = Field(
        False,
        description="every self-attention owns a relative_attention_bias table (UMT5Attention: "
        "has_relative_attention_bias=True); False: only the first block of each stack (T5Stack: "
        "bool(i == 0))",
    )
    pre_norm: bool = Field(
        False,
        description="the BART family's blocks normalise before each sub-layer and each stack ends with its "
        "own LayerNorm (MBartEncoderLayer / MBartDecoderLayer, MBartEncoder.layer_norm / "
        "MBartDecoder.layer_norm); False: BART's post-norm blocks",
    )
    scale_decoder_outputs: bool = Field(
        True,
        description="the decoder output is multiplied by d_model**-0.5 before lm_head "
        "(T5Config.scale_decoder_outputs: the config's tie_word_embeddings was not False; T5 v1.1 and mT5 "
        "checkpoints store False)",
    )


def encoder_layer_ids(spec: ModelSpec) -> range:
    """The block indices of the encoder stack."""
    assert spec.seq2seq is not None
    return range(spec.seq2seq.encoder_layers)


def is_decoder_layer(spec: ModelSpec, i: int) -> bool:
    """Whether block ``i`` is in the decoder stack."""
    return spec.seq2seq is not None and i >= spec.seq2seq.encoder_layers


def check_positions(spec: ModelSpec, source: int, target: int) -> None:
    """BART's learned position tables hold ``max_position_embeddings`` rows per stack (T5's relative positions
    have no limit): longer source or target sequences are refused, naming the field."""
    from gpumem_gui.core.errors import GpumemInputError

    s2s = spec.seq2seq
    if s2s is None or s2s.block != "bart":
        return
    limit = spec.max_position_embeddings
    for field, n in (("seq", source), ("new_tokens", target)):
        if n > limit:
            raise GpumemInputError(
                f"{n} tokens exceed {spec.name}'s {limit} learned positions (max_position_embeddings)",
                field=field,
            )


def cross_cache_bytes_per_source_token(spec: ModelSpec, bytes_per_element: float = 2) -> int:
    """Bytes the cross-attention cache holds per source token over all decoder layers: each
    ``T5LayerCrossAttention`` caches ``k`` and ``v`` of the encoder output ([batch, heads, source, d_kv] each,
    ``EncoderDecoderCache.cross_attention_cache``)."""
    assert spec.seq2seq is not None
    width = spec.num_attention_heads * spec.head_dim
    return round(spec.seq2seq.decoder_layers * 2 * width * bytes_per_element)


def self_cache_bytes_per_target_token(spec: ModelSpec, bytes_per_element: float = 2) -> int:
    """Bytes the decoder's self-attention cache holds per target token over all decoder layers
    (``EncoderDecoderCache.self_attention_cache``)."""
    assert spec.seq2seq is not None
    width = spec.num_attention_heads * spec.head_dim
    return round(spec.seq2seq.decoder_layers * 2 * width * bytes_per_element)
