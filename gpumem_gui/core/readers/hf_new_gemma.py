"""Readers of the model types issue 14 adds, group gemma: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``).

* ``gemma3n_text`` (Gemma3nTextConfig / Gemma3nForCausalLM): a Gemma-3-like decoder (q/k norms, a weightless
  v norm, four norms per layer, sliding layers every ``(i + 1) % 5 != 0``) plus a per-layer embedding table
  of ``num_layers x hidden_size_per_layer_input`` columns, AltUp's ``altup_num_inputs`` copies of the hidden
  state, a Laurel low-rank residual per layer (spec/altup.py) and KV sharing: the last
  ``num_kv_shared_layers`` layers have no k/v weights and no cache (Gemma3nTextConfig.kv_sharing_modes).
* ``gemma4_text`` and ``gemma4``: readers/hf_new_gemma4.py.
* ``gemma3n`` (Gemma3nForConditionalGeneration): the ``text_config``'s ``gemma3n_text`` model plus the
  timm vision tower, the audio tower and their embedders (readers/hf_new_gemma3n.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers import hf_new_gemma3n, hf_new_gemma4
from gpumem_gui.core.readers.config_fields import ConfigReader, common, layer_types_explicit, positive_number
from gpumem_gui.core.spec.altup import AltUpSpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# Gemma3nTextConfig defaults (models/gemma3n/configuration_gemma3n.py): the E4B geometry
_GEMMA3N_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_400,
    "hidden_size": 2048,
    "intermediate_size": 16_384,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32_768,
    "sliding_window": 512,
    "final_logit_softcapping": 30.0,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "altup_active_idx": 0,
    "altup_num_inputs": 4,
    "num_kv_shared_layers": 15,
    "laurel_rank": 64,
}


def _intermediate(r: ConfigReader, n: int) -> int:
    """Gemma3nTextConfig.__post_init__: an int, or one width per layer (Gemma3nTextMLP reads
    ``intermediate_size[layer_idx]``). gpumem models one width for every layer."""
    v = r.get("intermediate_size")
    if isinstance(v, list):
        if len(v) != n or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
            raise GpumemInputError(
                f"must be a positive int or {n} of them, got {short(v)}",
                source=r.source,
                field="intermediate_size",
            )
        if len(set(v)) != 1:
            raise GpumemInputError(
                "per-layer widths that differ are not modelled", source=r.source, field="intermediate_size"
            )
        return int(v[0])
    return r.int("intermediate_size")


def _sparse_layers(r: ConfigReader, n: int) -> tuple[int, ...]:
    """activation_sparsity_pattern: default 0.95 on the first 10 layers when there are more than 10."""
    v = r.get("activation_sparsity_pattern", default=None)
    if v is None:
        return tuple(range(10)) if n > 10 else ()
    if isinstance(v, int | float) and not isinstance(v, bool):
        v = [v] * n
    if (
        not isinstance(v, list)
        or len(v) != n
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1 for x in v)
    ):
        raise GpumemInputError(
            f"must list {n} sparsities in [0, 1), got {short(v)}",
            source=r.source,
            field="activation_sparsity_pattern",
        )
    return tuple(i for i, x in enumerate(v) if x > 0)


def _kv_shared(r: ConfigReader, layer_types: tuple[str, ...]) -> tuple[int, ...]:
    """Gemma3nTextConfig.kv_sharing_modes: the last ``num_kv_shared_layers`` layers reuse; the unshared ones
    must hold every layer type."""
    n = len(layer_types)
    shared = r.int("num_kv_shared_layers", minimum=0)
    if shared >= n:
        raise GpumemInputError(
            f"must be below num_hidden_layers ({n}), got {shared}",
            source=r.source,
            field="num_kv_shared_layers",
        )
    first = n - shared
    if shared and set(layer_types[:first]) != set(layer_types):
        raise GpumemInputError(
            "the unshared layers must include every layer type", source=r.source, field="num_kv_shared_layers"
        )
    return tuple(range(first, n))


def _gemma3n_text(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    r = ConfigReader({**_GEMMA3N_DEFAULTS, **r.cfg}, r.source)
    bias = r.bool("attention_bias", default=False)
    n = r.int("num_hidden_layers")
    width = _intermediate(r, n)
    r = ConfigReader({**r.cfg, "intermediate_size": width}, r.source)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, activation=str(r.get("hidden_activation")))
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    f["norms_per_layer"] = 4  # input, post_attention, pre_feedforward, post_feedforward
    f["qk_norm"] = "per_head"  # q_norm, k_norm (v_norm: with_scale=False, no weight)
    cap = r.get("final_logit_softcapping")
    f["final_logit_softcapping"] = (
        positive_number(cap, r.source, "final_logit_softcapping") if cap is not None else None
    )
    lt = layer_types_explicit(r, n) or tuple(
        "full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)
    )
    f["layer_types"] = lt
    f["sliding_window"] = r.int("sliding_window")
    f["kv_shared_layers"] = _kv_shared(r, lt)
    k = r.int("altup_num_inputs")
    active = r.int("altup_active_idx", minimum=0)
    if active >= k:
        raise GpumemInputError(
            f"must be below altup_num_inputs ({k}), got {active}", source=r.source, field="altup_active_idx"
        )
    f["altup"] = AltUpSpec(
        per_layer_vocab_size=r.int("vocab_size_per_layer_input"),
        per_layer_input_size=r.int("hidden_size_per_layer_input"),
        num_inputs=k,
        laurel_rank=r.int("laurel_rank"),
        sparse_layers=_sparse_layers(r, n),
    )
    return f


def _gemma3n(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Gemma3nConfig: Gemma3nTextConfig from ``text_config`` (class defaults when absent: the E4B geometry),
    the lm_head tied to the text embeddings (the wrapper's ``tie_word_embeddings``, default True), and the
    towers."""
    tc = r.get("text_config", default=None)
    if tc is not None and not isinstance(tc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    tr = ConfigReader(
        {**(tc or {}), "tie_word_embeddings": r.bool("tie_word_embeddings", default=True)},
        f"{r.source} (text_config)",
    )
    f = _gemma3n_text(tr, name, mt)
    f["vision"] = hf_new_gemma3n.towers(r, f["hidden_size"])
    return f


# Gemma3nTextScaledWordEmbedding (scaled embeddings); Gemma3nRMSNorm multiplies by weight (no 1 + weight);
# Gemma3nRotaryEmbedding: one table per layer type; the four norms of Gemma3nTextDecoderLayer; llama.cpp
# LLM_ARCH_GEMMA3N
READERS["gemma3n_text"] = _gemma3n_text
TRAITS["gemma3n_text"] = {
    "embedding_scale": True,
    "norm_placement": "sandwich",
    "rotary_per_layer_type": True,
    "gguf_arch": "gemma3n",
    "model_forward": "altup",
}
READERS["gemma3n"] = _gemma3n
TRAITS["gemma3n"] = dict(TRAITS["gemma3n_text"])

# Gemma 4 (readers/hf_new_gemma4.py): Gemma4TextScaledWordEmbedding, Gemma4RMSNorm (weight, no 1 +), one
# rotary table per layer type (Gemma4TextRotaryEmbedding), the four norms of Gemma4TextDecoderLayer
_GEMMA4_TRAITS = {
    "embedding_scale": True,
    "norm_placement": "sandwich",
    "rotary_per_layer_type": True,
    "model_forward": "gemma4",
}
READERS["gemma4_text"] = hf_new_gemma4.gemma4_text
READERS["gemma4"] = hf_new_gemma4.gemma4
TRAITS["gemma4_text"] = dict(_GEMMA4_TRAITS)
TRAITS["gemma4"] = dict(_GEMMA4_TRAITS)
