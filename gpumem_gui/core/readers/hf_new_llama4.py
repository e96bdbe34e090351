"""Readers of the model types issue 14 adds, group llama4: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``).

* ``llama4_text`` (Llama4TextConfig / Llama4ForCausalLM) and ``llama4`` (Llama4Config, the
  ``text_config``-wrapped Llama4ForConditionalGeneration with its Llama4VisionModel and projector).
* Llama4TextConfig.__post_init__: ``no_rope_layers[i] == 0`` marks a NoPE layer (default: every
  ``no_rope_layer_interval``-th); ``moe_layers`` default ``range(step - 1, layers, step)`` with
  ``interleave_moe_layer_step``; ``layer_types`` default ``chunked_attention`` on the rotary layers when
  ``attention_chunk_size`` is set, else ``full_attention``.
* Llama4TextDecoderLayer: a MoE layer is Llama4TextMoe (``num_local_experts`` experts and one shared expert,
  both of ``intermediate_size``; Llama4Router is a bias-free Linear(hidden, experts)); a dense layer is
  Llama4TextMLP of ``intermediate_size_mlp``. Llama4TextAttention: ``qk_norm`` (Llama4TextL2Norm, no
  weight) only on rotary layers with ``use_qk_norm``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, common
from gpumem_gui.core.readers.hf_modern import _moe
from gpumem_gui.core.readers.vision_tower import llama4_tower
from gpumem_gui.core.spec.model import MAX_SIZE, VisionSpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# Llama4TextConfig defaults (models/llama4/configuration_llama4.py)
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048,
    "hidden_size": 5120,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096 * 32,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
}
# Llama4VisionConfig defaults
_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5632,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
}
_LAYER_TYPES = ("full_attention", "chunked_attention")  # Llama4TextModel's mask_creation_functions


def _int_list(
    r: ConfigReader, key: str, n: int, what: str, allowed: Callable[[Any], bool]
) -> list[Any] | None:
    v = r.get(key, default=None)
    if v is None:
        return None
    if not isinstance(v, list) or not all(allowed(x) for x in v):
        raise GpumemInputError(f"must be a list of {what}, got {short(v)}", source=r.source, field=key)
    return v


def _rope_flags(r: ConfigReader, n: int) -> tuple[int, ...]:
    """``no_rope_layers``: 1 = the layer uses rope (Llama4TextAttention.use_rope), read at ``[layer_idx]``,
    so at least one per layer; absent or empty: a NoPE layer every ``no_rope_layer_interval``."""
    flags = _int_list(r, "no_rope_layers", n, "0/1 flags", lambda x: x in (0, 1) and not isinstance(x, float))
    if not flags:
        interval = r.int("no_rope_layer_interval", default=4)
        return tuple(int((i + 1) % interval != 0) for i in range(n))
    if len(flags) < n:
        raise GpumemInputError(
            f"has {len(flags)} entries for {n} layers", source=r.source, field="no_rope_layers"
        )
    return tuple(int(x) for x in flags[:n])


def _moe_layers(r: ConfigReader, n: int) -> set[int]:
    layers = _int_list(
        r, "moe_layers", n, f"layer indices in [0, {n})", lambda x: isinstance(x, int) and 0 <= x < n
    )
    if layers is not None:
        return set(layers)
    step = r.int("interleave_moe_layer_step", default=1)
    return set(range(step - 1, n, step))


def _layer_types(r: ConfigReader, n: int, rope: tuple[int, ...], chunk: int | None) -> tuple[str, ...]:
    explicit = r.get("layer_types", default=None)
    if explicit is None:
        return tuple(
            "chunked_attention" if rope[i] and chunk is not None else "full_attention" for i in range(n)
        )
    if (
        not isinstance(explicit, list)
        or len(explicit) != n
        or not set(map(str, explicit)) <= set(_LAYER_TYPES)
    ):
        raise GpumemInputError(
            f"must list one of {list(_LAYER_TYPES)} per layer ({n})", source=r.source, field="layer_types"
        )
    if "chunked_attention" in explicit and chunk is None:
        raise GpumemInputError(
            "chunked_attention layers need attention_chunk_size", source=r.source, field="layer_types"
        )
    return tuple(explicit)


def _text(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Llama4TextConfig -> the text model's fields (Llama4ForCausalLM)."""
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias)
    f["intermediate_size"] = r.int("intermediate_size_mlp")  # the dense layers' Llama4TextMLP
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    rope = _rope_flags(r, n)
    f["nope_layers"] = tuple(i for i in range(n) if not rope[i])
    chunk = r.opt_int("attention_chunk_size") if "attention_chunk_size" in r.cfg else 8192
    f["layer_types"] = _layer_types(r, n, rope, chunk)
    f["attention_chunk_size"] = chunk if "chunked_attention" in f["layer_types"] else None
    f["qk_norm"] = "l2" if r.bool("use_qk_norm", default=True) else "none"
    moe_layers = _moe_layers(r, n)
    expert = r.int("intermediate_size")
    f["moe"] = _moe(
        r,
        "num_local_experts",
        expert_intermediate_size=expert,
        shared_expert_intermediate_size=expert,  # Llama4TextMoe.shared_expert = Llama4TextMLP(config)
        dense_layers=tuple(i for i in range(n) if i not in moe_layers),
    )
    f["model_type"] = mt
    return f


def _llama4_text(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    return _text(ConfigReader({**_TEXT_DEFAULTS, **r.cfg}, r.source), name, mt)


def _vision_params(v: ConfigReader) -> tuple[int, int]:
    """(Llama4VisionModel parameters, tokens one 336-px tile adds after the pixel shuffle)."""
    h, inter, layers = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers", minimum=0)
    heads, ch = v.int("num_attention_heads"), v.int("num_channels")
    img, patch = v.int("image_size"), v.int("patch_size")
    width = heads * (h // heads)  # Llama4VisionAttention: heads x (hidden // heads)
    patches = (img // patch) ** 2
    # Llama4UnfoldConvolution linear (no bias), class_embedding, positional_embedding_vlm (patches + 1 rows),
    # layernorm_pre / layernorm_post (nn.LayerNorm: weight and bias)
    embed = ch * patch * patch * h + h + (patches + 1) * h + 2 * 2 * h
    # Llama4VisionEncoderLayer: q/k/v/o with biases, Llama4VisionMLP fc1/fc2 with biases, two LayerNorms
    per_layer = 3 * (h * width + width) + (width * h + h) + (h * inter + inter) + (inter * h + h) + 2 * 2 * h
    # Llama4VisionPixelShuffleMLP.mlp (Llama4VisionMLP2): fc1 Linear(intermediate_size, projector_input_dim),
    # fc2 Linear(projector_output_dim, projector_output_dim), no biases
    adapter = inter * v.int("projector_input_dim") + v.int("projector_output_dim") ** 2
    ratio = v.get("pixel_shuffle_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
        raise GpumemInputError(
            f"must be in (0, 1], got {short(ratio)}", source=v.source, field="pixel_shuffle_ratio"
        )
    return embed + layers * per_layer + adapter, int(patches * ratio * ratio)


def _llama4(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Llama4Config: the text model from ``text_config`` plus the vision tower and projector."""
    text_cfg = r.get("text_config", default={})
    if not isinstance(text_cfg, dict):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    f = _text(ConfigReader({**_TEXT_DEFAULTS, **text_cfg}, f"{r.source} (text_config)"), name, mt)
    vis_cfg = r.get("vision_config", default={})
    if not isinstance(vis_cfg, dict):
        raise GpumemInputError("must be an object", source=r.source, field="vision_config")
    vr = ConfigReader({**_VISION_DEFAULTS, **vis_cfg}, f"{r.source} (vision_config)")
    tower, tile_tokens = _vision_params(vr)
    # Llama4MultiModalProjector.linear_1: Linear(vision_output_dim, text hidden_size), no bias
    projector = vr.int("vision_output_dim") * f["hidden_size"]
    for what, n in (("vision tower", tower), ("projector", projector)):
        if n > MAX_SIZE:
            raise GpumemInputError(
                f"the {what} would have {n:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                source=r.source,
                field="vision_config",
            )
    # positional_embedding_vlm is an nn.Parameter, not an nn.Embedding table: counted in the tower
    f["vision"] = VisionSpec(
        kind="llama4_vision",
        tower_params=tower,
        projector_params=projector,
        image_tokens=tile_tokens,
        tower=llama4_tower(vr, f["hidden_size"]),  # the activations' replay (replay/vision_llama4.py)
    )
    return f


def _attn_temperature(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``attn_temperature_tuning`` (Llama4TextConfig default True). Meta's Llama 4 configs carry the integer
    4, which transformers 4.5x read as a truth value (``if self.attn_temperature_tuning and not
    self.use_rope``) and 5.24's strict config class refuses; it is read here as 4.5x read it. Other types are
    errors."""
    text = cfg.get("text_config") if cfg.get("model_type") == "llama4" else cfg
    text = text if isinstance(text, Mapping) else {}
    v = text.get("attn_temperature_tuning", True)
    if v is None:
        v = True
    if isinstance(v, float) or not isinstance(v, int) or v < 0:
        raise GpumemInputError(
            f"must be true or false, got {short(v)}", source=source, field="attn_temperature_tuning"
        )
    return {"attn_temperature_tuning": bool(v)}


# Llama4TextRotaryEmbedding (complex freqs_cis), Llama4TextMoe (scores scale the input, bmm experts),
# eager_attention_forward keeps the softmax in the activation dtype; Llama4TextDecoderLayer holds
# attention_states until it returns; llama.cpp LLM_ARCH_LLAMA4
_TRAITS = {
    "rope_complex": True,
    "moe_scaled_input": True,
    "eager_softmax_fp32": False,
    "attn_output_kept": True,
    "gguf_arch": "llama4",
}
for _mt, _reader in (("llama4_text", _llama4_text), ("llama4", _llama4)):
    READERS[_mt] = _reader
    TRAITS[_mt] = dict(_TRAITS)
    CONFIG_TRAITS[_mt] = _attn_temperature
# SGLang's hybrid-SWA allowlist names Llama4ForConditionalGeneration (the llama4 checkpoints), not the
# text-only Llama4ForCausalLM (configs/model_config.py is_hybrid_swa_model): its chunked layers get the
# SWA pool
TRAITS["llama4"]["sglang_hybrid_swa"] = True
