"""Encoder-decoders (T5) in the trace worker: ``generate()``'s encoder pass and decoder steps, and the
teacher-forced training forward.

``generate()`` of an encoder-decoder (transformers 5.24 ``generation/utils.py``) runs the encoder once
(``_prepare_encoder_decoder_kwargs_for_generation``: ``model.get_encoder()(input_ids)``, its output kept in
``model_kwargs`` for the whole generation), starts the decoder from ``decoder_start_token_id`` (a [batch, 1]
``decoder_input_ids``) and runs one decoder step per new token with an ``EncoderDecoderCache``: the first step
fills each layer's cross-attention keys and values from the encoder output, every step appends one token to
the self-attention cache.
"""

from __future__ import annotations

import gc
from typing import Any


def is_seq2seq(cfg: Any) -> bool:
    """Whether ``cfg`` is an encoder-decoder (``PreTrainedConfig.is_encoder_decoder``)."""
    return bool(getattr(cfg, "is_encoder_decoder", False))


def auto_class(cfg: Any) -> Any:
    """The Auto class of a model without a task head: ``AutoModelForSeq2SeqLM`` for an encoder-decoder,
    ``AutoModelForCausalLM`` otherwise; ``AutoModelForPreTraining`` for a config that only it maps to a causal
    LM (transformers 5.24 lists Mistral4ForCausalLM under MODEL_FOR_PRETRAINING_MAPPING_NAMES alone)."""
    import transformers

    if is_seq2seq(cfg):
        return transformers.AutoModelForSeq2SeqLM
    causal, pretraining = transformers.AutoModelForCausalLM, transformers.AutoModelForPreTraining
    own = pretraining._model_mapping.get(type(cfg), None) if type(cfg) not in causal._model_mapping else None
    return pretraining if own is not None and own.__name__.endswith("ForCausalLM") else causal


def _cache_of(res: Any) -> Any:
    return getattr(res, "cache", None) or getattr(res, "past_key_values", None)


def split_cache_bytes(cache: Any) -> tuple[int, int]:
    """Bytes of the self-attention and the cross-attention caches of an ``EncoderDecoderCache`` (the run's
    ``kv_cache_bytes`` is their sum, ``cross_cache_bytes`` the second)."""
    from .inference import cache_bytes

    return cache_bytes(cache.self_attention_cache), cache_bytes(cache.cross_attention_cache)


def _ids(cfg: Any, batch: int, n: int) -> Any:
    import torch

    return torch.randint(0, int(cfg.vocab_size), (batch, n))


def trace_generate(
    model: Any, mt: Any, cfg: Any, batch: int, seq: int, new: int, out: dict[str, Any]
) -> None:
    """Phase ``prefill``: the encoder over ``seq`` source tokens and the first decoder step (the start token,
    the cross-attention cache filled). Phase ``decode`` (``new`` > 1): the last step, one token after
    ``new - 1`` cached target tokens, while the encoder output and the previous step's fp32 scores (next-token
    logits and processed scores) are alive."""
    import torch

    inputs = _ids(cfg, batch, seq)  # generate()'s inputs_tensor stays referenced
    encoder_outputs = model.get_encoder()(input_ids=inputs)
    start = torch.zeros((batch, 1), dtype=torch.long)  # decoder_start_token_id
    res = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
    out["logits_bytes"] = int(res.logits.numel() * res.logits.element_size())
    self_b, cross_b = split_cache_bytes(_cache_of(res))
    out["kv_cache_bytes"], out["cross_cache_bytes"] = self_b + cross_b, cross_b
    del res, start
    if new <= 1:
        return
    mt.enter("warmup")
    gc.collect()
    cache = None
    past = new - 1  # target tokens cached before the last step
    if past > 1:
        res = model(
            encoder_outputs=encoder_outputs, decoder_input_ids=_ids(cfg, batch, past - 1), use_cache=True
        )
        cache = _cache_of(res)
        del res
    mt.reset_mod_stats()
    res = model(
        encoder_outputs=encoder_outputs, decoder_input_ids=_ids(cfg, batch, 1), cache=cache, use_cache=True
    )
    cache = _cache_of(res)
    scores = res.logits[:, -1].to(copy=True, dtype=torch.float32)
    processed = scores.clone()
    del res
    mt.enter("decode")
    step = _ids(cfg, batch, 1)
    res = model(encoder_outputs=encoder_outputs, decoder_input_ids=step, cache=cache, use_cache=True)
    self_b, cross_b = split_cache_bytes(_cache_of(res))
    out["kv_cache_bytes"], out["cross_cache_bytes"] = self_b + cross_b, cross_b
    del res, step, scores, processed, cache, encoder_outputs, inputs


def forward_loss(model: Any, ids: Any, target: int) -> Any:
    """``model(input_ids, labels).loss``: the encoder over the source ids, the decoder teacher-forced over
    ``target`` tokens (``decoder_input_ids = _shift_right(labels)``), CrossEntropyLoss over its logits."""
    labels = _ids(model.config, ids.shape[0], target)
    return model(input_ids=ids, labels=labels).loss
