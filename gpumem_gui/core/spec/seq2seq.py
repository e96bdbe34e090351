"""``Seq2SeqSpec``: what makes a :class:`~gpumem_gui.core.spec.model.ModelSpec` an encoder-decoder (T5, mT5,
UMT5) rather than a decoder-only model.

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

The generation cache is ``EncoderDecoderCache`` (``cache_utils.py``): a ``DynamicCache`` of the decoder's
self-attention keys and values per target token, and one of the cross-attention keys and values, computed once
from the encoder's output (source tokens) per decoder layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

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
    relative_attention_num_buckets: Annotated[int, Field(gt=0, le=1 << 16)] = Field(
        description="rows of each relative_attention_bias table (nn.Embedding(num_buckets, n_heads); "
        "T5Config default 32)"
    )
    relative_attention_max_distance: Annotated[int, Field(gt=0, le=1 << 24)] = Field(
        description="distance beyond which all relative positions share a bucket (T5Config default 128)"
    )
    bias_every_layer: bool = Field(
        False,
        description="every self-attention owns a relative_attention_bias table (UMT5Attention: "
        "has_relative_attention_bias=True); False: only the first block of each stack (T5Stack: "
        "bool(i == 0))",
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


def refuse_seq2seq(spec: ModelSpec, field: str = "model") -> None:
    """Fine-tuning memory of encoder-decoders is not modelled yet (inference is: runtimes/seq2seq.py): a
    training run refuses rather than replaying them as a decoder-only model."""
    from gpumem_gui.core.errors import GpumemInputError

    if spec.seq2seq is not None:
        raise GpumemInputError(
            f"{spec.name} is an encoder-decoder: its inference is modelled, its "
            "fine-tuning not yet; measure it with `gpumem trace --mode train`",
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
