"""Runs of a model with cross-attention layers (Llama 3.2 Vision, layer type ``cross_attention``): which
engines are modelled, and the cross-attention cache ``run.images`` images add (spec/cross_attention.py):
transformers' own cache (:func:`cross_cache_component`), SGLang's pool slots (:func:`with_encoder_tokens`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.vision import has_tower
from gpumem_gui.core.results.estimate import Component, Explanation
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.cross_attention import (
    cross_attention_layers,
    cross_cache_bytes,
    cross_tokens_per_image,
)
from gpumem_gui.core.spec.kinds import CrossAttention
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

if TYPE_CHECKING:
    from gpumem_gui.core.runtimes.base import Runtime


def check_cross_attention(spec: ModelSpec, run: InferenceRun, rt: Runtime) -> list[str]:
    """One-line errors and the warnings of ``run`` on ``spec``: the cross-attention cache is modelled for
    transformers only (each serving engine's refusal says whether it runs such a model at all:
    ``Runtime.cross_attention_refusal``); images on a model without cross-attention layers are not counted."""
    if not cross_attention_layers(spec):
        if run.images and not has_tower(spec):  # a replayed vision tower counts them (replay/vision.py)
            return ["images: the model has no cross-attention layers; the images are not counted"]
        return []
    if not all(rt.supports(k) for k in model_kinds(spec).of(CrossAttention)):
        raise GpumemInputError(
            rt.cross_attention_refusal
            or f"{run.engine}: the cross-attention cache of a model with cross-attention layers (Llama 3.2 "
            "Vision) is not modelled for this engine yet; use the transformers engine",
            field="engine",
        )
    if run.images:
        return [
            "images: the cached vision keys and values are counted; the vision tower's activations and the "
            "cross-attention layers' activations in the first forward are not replayed"
        ]
    return []


def cross_cache_component(rank: ModelSpec, run: InferenceRun, kv_bytes: float) -> Component | None:
    """The vision keys and values the cross-attention layers of ``rank`` (one rank's spec) hold for the run's
    images, from the first forward to the end of the generation; None without images."""
    n = cross_cache_bytes(rank, run.images, run.batch, kv_bytes)
    if not n:
        return None
    layers = cross_attention_layers(rank)
    return Component(
        key="cross_attention_cache",
        label="cross-attention cache (images)",
        bytes=n,
        explain=Explanation(
            formula="cross-attention layers x batch x images x vision tokens per image x 2 (K, V) x KV "
            "heads x head_dim x bytes",
            inputs={
                "cross_attention_layers": layers,
                "batch": run.batch,
                "images": run.images,
                "tokens_per_image": cross_tokens_per_image(rank),
                "kv_heads": rank.num_kv_heads,
                "head_dim": rank.head_dim,
                "bytes": kv_bytes,
            },
            source="transformers 5.24 models/mllama/modeling_mllama.py MllamaTextCrossAttention "
            "(cache.update of the projected vision states); measured: "
            "tests/reference/extra/cross_cache_mllama.json",
        ),
    )


def encoder_tokens(spec: ModelSpec, run: InferenceRun) -> int:
    """Vision tokens one request of ``run`` carries into a serving engine's token pool: ``images x
    max_num_tiles x num_patches`` on a model with cross-attention layers, else 0."""
    return run.images * cross_tokens_per_image(spec) if cross_attention_layers(spec) else 0


def with_encoder_tokens(spec: ModelSpec, run: InferenceRun) -> InferenceRun:
    """``run`` with each request's vision tokens in front of its prompt, as SGLang serves Llama 3.2 Vision
    (python/sglang/srt/models/mllama.py ``MllamaForConditionalGeneration.pad_input_ids``: ``image_len =
    num_concurrent_media x num_tiles x num_patches`` pad ids prepended to ``input_ids``, num_tiles the
    processor's padded ``max_num_tiles``; ``managers/schedule_batch.py`` ``prepare_encoder_info_extend``
    splits the request's ``out_cache_loc`` into the encoder's ``encoder_out_cache_loc``, where the
    cross-attention layers write the vision keys and values, and the decoder's): one token-to-KV pool slot,
    of every layer, per vision token and request, for the request's whole life."""
    n = encoder_tokens(spec, run)
    return run.model_copy(update={"seq": run.seq + n}) if n else run
