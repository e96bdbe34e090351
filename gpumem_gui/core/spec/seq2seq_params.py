"""The parameter tensors of an encoder-decoder (:class:`~gpumem_gui.core.spec.seq2seq.Seq2SeqSpec`), named as
the rest of the accounting names them (``embed_tokens``, ``layers.{i}.self_attn.q_proj``, ...).

transformers 5.24 ``models/t5/modeling_t5.py`` ``T5ForConditionalGeneration`` (mT5: ``modeling_mt5.py``,
UMT5: ``modeling_umt5.py``, the same shapes; BART: ``models/bart/modeling_bart.py``
``BartForConditionalGeneration``, see :func:`seq2seq_tensors`):

* ``shared`` (vocab x d_model), tied to ``encoder.embed_tokens``, ``decoder.embed_tokens`` and ``lm_head``
  (``_tied_weights_keys``; ``T5Config.__post_init__`` sets ``tie_word_embeddings = True``): counted once;
* each block: ``T5Attention`` ``q``, ``k``, ``v`` (d_model -> heads x d_kv) and ``o`` without biases, a
  ``relative_attention_bias`` (num_buckets x heads) in the first block of each stack (UMT5: every block),
  ``T5LayerNorm`` weights only; ``T5DenseActDense`` ``wi``, ``wo`` or ``T5DenseGatedActDense`` ``wi_0``,
  ``wi_1``, ``wo``, no biases;
* decoder blocks add ``T5LayerCrossAttention`` (``EncDecAttention`` q, k, v, o and its layer norm);
* ``final_layer_norm`` of each stack.

Block ``i`` of ``ModelSpec.num_layers`` is encoder block ``i`` below ``encoder_layers``, decoder block
``i - encoder_layers`` above.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor, _attention, _feed_forward, _linear, _norm_tensors


def _cross_attention(spec: ModelSpec, i: int) -> Iterator[Tensor]:
    """T5LayerCrossAttention.EncDecAttention: q, k, v, o without biases, no bias table (BART's encoder_attn:
    with biases)."""
    h, inner, p = spec.hidden_size, spec.q_width, f"layers.{i}.cross_attn"
    yield from _linear(f"{p}.q_proj", h, inner, spec.qkv_bias, "attention", i)
    yield from _linear(f"{p}.k_proj", h, inner, spec.qkv_bias, "attention", i)
    yield from _linear(f"{p}.v_proj", h, inner, spec.qkv_bias, "attention", i)
    yield from _linear(f"{p}.o_proj", inner, h, spec.o_bias, "attention", i)


def _bart_stack(spec: ModelSpec, stack: str) -> Iterator[Tensor]:
    """BartEncoder / BartDecoder: ``embed_positions`` (BartLearnedPositionalEmbedding, max positions + 2
    rows) and ``layernorm_embedding`` (nn.LayerNorm); MBart's stacks also end with ``layer_norm``."""
    h = spec.hidden_size
    yield Tensor(f"{stack}.embed_positions.weight", (spec.learned_position_rows, h), "position_embedding")
    yield from _norm_tensors(spec, f"{stack}.layernorm_embedding", h, None)
    if spec.seq2seq is not None and spec.seq2seq.pre_norm:  # MBartEncoder / MBartDecoder.layer_norm
        yield from _norm_tensors(spec, f"{stack}.layer_norm", h, None)


def seq2seq_tensors(spec: ModelSpec) -> Iterator[Tensor]:
    """Every parameter tensor of the encoder-decoder, tied weights once (BART: the blocks named like T5's,
    self_attn_layer_norm as ``norm0``, encoder_attn(_layer_norm) as ``cross_attn`` / ``norm_cross``,
    final_layer_norm as ``norm1``, fc1 / fc2 as the MLP's up / down projections)."""
    s2s = spec.seq2seq
    assert s2s is not None
    h, enc, bart = spec.hidden_size, s2s.encoder_layers, s2s.block == "bart"
    yield Tensor("embed_tokens.weight", (spec.vocab_size, h), "embedding")
    if bart:
        yield from _bart_stack(spec, "encoder")
        yield from _bart_stack(spec, "decoder")
    for i in range(spec.num_layers):
        decoder = i >= enc
        yield from _norm_tensors(spec, f"layers.{i}.norm0", h, i)
        yield from _attention(spec, i)
        if not bart and (s2s.bias_every_layer or i in (0, enc)):  # T5Stack: bool(i == 0)
            yield Tensor(
                f"layers.{i}.self_attn.relative_attention_bias.weight",
                (s2s.relative_attention_num_buckets, spec.num_attention_heads),
                "position_embedding",
                i,
            )
        if decoder:
            yield from _norm_tensors(spec, f"layers.{i}.norm_cross", h, i)
            yield from _cross_attention(spec, i)
        yield from _norm_tensors(spec, f"layers.{i}.norm1", h, i)
        yield from _feed_forward(spec, i)
        if i == enc - 1 and not bart:
            yield from _norm_tensors(spec, "encoder_norm", h, None)
    if not bart:  # T5Stack.final_layer_norm (BART's post-norm stacks end with a block's norm)
        yield from _norm_tensors(spec, "norm", h, None)
    if not spec.tie_word_embeddings:
        yield from _linear("lm_head", h, spec.vocab_size, False, "lm_head", None)


def seq2seq_layer_kinds(spec: ModelSpec) -> tuple[int, tuple[int, ...], ModelSpec]:
    """The distinct blocks for the weight layout (formats/layout.py): the first encoder block (its bias
    table), the other encoder blocks, the first decoder block (bias table, cross-attention), the other decoder
    blocks; each block's kind; a model with at most two blocks of each stack."""
    s2s = spec.seq2seq
    assert s2s is not None
    enc, dec = min(s2s.encoder_layers, 2), min(s2s.decoder_layers, 2)
    kinds = tuple(min(i, enc - 1) for i in range(s2s.encoder_layers)) + tuple(
        enc + min(j, dec - 1) for j in range(s2s.decoder_layers)
    )
    mini_s2s = s2s.model_copy(update={"encoder_layers": enc, "decoder_layers": dec})
    mini = spec.model_copy(update={"num_layers": enc + dec, "layer_types": (), "seq2seq": mini_s2s})
    return enc + dec, kinds, mini


def seq2seq_buffer_bytes(spec: ModelSpec, param_bytes: float) -> int:
    """BartForConditionalGeneration.final_logits_bias: a [1, vocab] buffer built in the default dtype (the
    weights'); T5 has no buffers."""
    s2s = spec.seq2seq
    return round(spec.vocab_size * param_bytes) if s2s is not None and s2s.block == "bart" else 0
