"""The parameter tensors of an encoder (:class:`~gpumem_gui.core.spec.encoder.EncoderSpec`) and its head,
named as the rest of the accounting names them (``embed_tokens``, ``layers.{i}.self_attn.q_proj``, ...).

transformers 5.24, ``models/bert/modeling_bert.py`` (RoBERTa: ``models/roberta/modeling_roberta.py``, the same
shapes): ``BertEmbeddings`` (word, position and token-type tables, a LayerNorm), each ``BertLayer``
(query/key/value and ``attention.output.dense`` with biases, ``attention.output.LayerNorm``,
``intermediate.dense``, ``output.dense``, ``output.LayerNorm``), no final norm; the heads:

* sequence classification: ``BertPooler.dense`` + ``classifier`` (BERT), or
  ``RobertaClassificationHead`` ``dense`` + ``out_proj`` (RoBERTa: ``add_pooling_layer=False``);
* token classification: ``classifier`` on every token (no pooler);
* masked LM: ``BertPredictionHeadTransform`` (``dense``, ``LayerNorm``) and the ``decoder`` over the
  vocabulary, its weight tied to the word embedding and its bias tied to ``predictions.bias`` (counted once).

Every head tensor is in the ``lm_head`` component (the output head of the model).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor, _attention, _feed_forward, _linear, _norm_tensors

HEAD = "lm_head"


def head_tensors(spec: ModelSpec) -> Iterator[Tensor]:
    """The task head's tensors (see the module docstring)."""
    enc = spec.encoder
    assert enc is not None
    h, labels = spec.hidden_size, enc.num_labels
    if enc.block == "modernbert":
        yield from _modern_head(spec)
        return
    if enc.head == "sequence_classification":
        if enc.classifier == "pooler":
            yield from _linear("pooler.dense", h, h, True, HEAD, None)
            yield from _linear("classifier", h, labels, True, HEAD, None)
        else:
            yield from _linear("classifier.dense", h, h, True, HEAD, None)
            yield from _linear("classifier.out_proj", h, labels, True, HEAD, None)
    elif enc.head == "token_classification":
        yield from _linear("classifier", h, labels, True, HEAD, None)
    else:
        yield from _linear("head.dense", h, h, True, HEAD, None)
        yield Tensor("head.norm.weight", (h,), HEAD)
        yield Tensor("head.norm.bias", (h,), HEAD)
        if not spec.tie_word_embeddings:
            yield Tensor("lm_head.weight", (spec.vocab_size, h), HEAD)
        yield Tensor("lm_head.bias", (spec.vocab_size,), HEAD)


def _modern_head(spec: ModelSpec) -> Iterator[Tensor]:
    """ModernBertPredictionHead (dense with classifier_bias, act, LayerNorm) on every head, then the
    classifier (with a bias) or the decoder (tied, decoder_bias)."""
    enc = spec.encoder
    assert enc is not None
    h = spec.hidden_size
    yield from _linear("head.dense", h, h, enc.head_dense_bias, HEAD, None)
    yield Tensor("head.norm.weight", (h,), HEAD)
    if spec.norm_bias:
        yield Tensor("head.norm.bias", (h,), HEAD)
    if enc.head != "masked_lm":
        yield from _linear("classifier", h, enc.num_labels, True, HEAD, None)
        return
    if not spec.tie_word_embeddings:
        yield Tensor("lm_head.weight", (spec.vocab_size, h), HEAD)
    if enc.decoder_bias:
        yield Tensor("lm_head.bias", (spec.vocab_size,), HEAD)


def _modern_tensors(spec: ModelSpec) -> Iterator[Tensor]:
    """ModernBertModel: tok_embeddings and their norm, each layer's attn_norm (an Identity in layer 0),
    Wqkv, Wo, mlp_norm, Wi, Wo, the final norm."""
    h = spec.hidden_size
    yield Tensor("embed_tokens.weight", (spec.vocab_size, h), "embedding")
    yield from _norm_tensors(spec, "embedding_norm", h, None)
    for i in range(spec.num_layers):
        if i:
            yield from _norm_tensors(spec, f"layers.{i}.norm0", h, i)
        yield from _attention(spec, i)
        yield from _norm_tensors(spec, f"layers.{i}.norm1", h, i)
        yield from _feed_forward(spec, i)
    yield from _norm_tensors(spec, "norm", h, None)
    yield from head_tensors(spec)


def modern_layer_kinds(spec: ModelSpec) -> tuple[int, tuple[int, ...], ModelSpec]:
    """ModernBERT's distinct layers for the weight layout (formats/layout.py): layer 0 (its attn_norm an
    Identity) and every other layer; each layer's kind; a model with one layer of each."""
    n = spec.num_layers
    mini = spec.model_copy(update={"num_layers": min(n, 2), "layer_types": ()})
    return min(n, 2), tuple(min(i, 1) for i in range(n)), mini


def encoder_tensors(spec: ModelSpec) -> Iterator[Tensor]:
    """Every parameter tensor of the encoder and its head, tied weights once."""
    enc = spec.encoder
    assert enc is not None
    if enc.block == "modernbert":
        yield from _modern_tensors(spec)
        return
    h = spec.hidden_size
    yield Tensor("embed_tokens.weight", (spec.vocab_size, h), "embedding")
    if enc.type_vocab_size:
        yield Tensor("token_type_embeddings.weight", (enc.type_vocab_size, h), "embedding_extra")
    if spec.position_embedding == "learned":
        yield Tensor("embed_positions.weight", (spec.learned_position_rows, h), "position_embedding")
    yield from _norm_tensors(spec, "embedding_norm", h, None)
    for i in range(spec.num_layers):
        yield from _attention(spec, i)
        yield from _norm_tensors(spec, f"layers.{i}.norm0", h, i)
        yield from _feed_forward(spec, i)
        yield from _norm_tensors(spec, f"layers.{i}.norm1", h, i)
    if enc.block == "deberta":  # DebertaV2Encoder.rel_embeddings (an nn.Embedding) and its LayerNorm
        yield Tensor("rel.embed_positions.weight", (2 * enc.relative_span, h), "position_embedding")
        yield from _norm_tensors(spec, "rel_norm", h, None)
    yield from head_tensors(spec)


def saved_module(spec: ModelSpec, name: str) -> bool:
    """Whether tensor ``name`` is in a module PEFT keeps as a trainable copy instead of adapting it: the
    classifier of a classification head (PeftModelForSequenceClassification / ForTokenClassification
    ``modules_to_save = ["classifier", "score"]``)."""
    enc = spec.encoder
    return enc is not None and enc.head != "masked_lm" and name.startswith("classifier.")


def encoder_buffers_bytes(spec: ModelSpec) -> int:
    """``BertEmbeddings`` / ``RobertaEmbeddings`` buffers: ``position_ids`` and ``token_type_ids``, int64
    [1, max_position_embeddings] each (non-persistent, built with the model); ModernBERT's rotary buffers."""
    enc = spec.encoder
    assert enc is not None
    if enc.block == "modernbert":  # ModernBertRotaryEmbedding: inv_freq and original_inv_freq per layer type
        return len(set(spec.resolved_layer_types)) * 2 * (spec.head_dim // 2) * 4
    if enc.block == "deberta":  # DebertaV2Embeddings.position_ids only
        return spec.max_position_embeddings * 8
    return 2 * spec.learned_position_rows * 8
