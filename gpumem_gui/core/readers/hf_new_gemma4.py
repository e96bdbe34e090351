"""Readers of Gemma 4 (``models/gemma4/configuration_gemma4.py``, transformers 5.24), gathered into group
gemma's tables by :mod:`.hf_new_gemma`.

* ``gemma4_text`` (Gemma4TextConfig / Gemma4ForCausalLM): spec/gemma4.py lists what differs from Gemma 3.
* ``gemma4`` (Gemma4Config / Gemma4ForConditionalGeneration): the text model from ``text_config``; the
  vision tower (Gemma4VisionModel) and the audio conformer (Gemma4AudioModel) with their embedders
  (Gemma4MultimodalEmbedder) counted exactly into :class:`VisionSpec` (towers as ``tower_params``, embedders
  as ``projector_params``). A missing or null ``vision_config`` / ``audio_config`` builds no tower
  (SubConfigSpec(optional=True)); the fields a given one lacks take the class defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, common, layer_types_explicit, positive_number
from gpumem_gui.core.spec.gemma4 import Gemma4Spec
from gpumem_gui.core.spec.model import MAX_SIZE, MoESpec, VisionSpec

# Gemma4TextConfig class defaults
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "sliding_window": 512,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 0,
    "global_head_dim": 512,  # Gemma4TextConfig.__post_init__: kwargs.pop("global_head_dim", 512)
}
# Gemma4VisionConfig class defaults
_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "patch_size": 16,
    "position_embedding_size": 10 * 1024,
    "pooling_kernel_size": 3,
}
# Gemma4AudioConfig class defaults
_AUDIO_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "subsampling_conv_channels": [128, 32],
    "conv_kernel_size": 5,
    "output_proj_dims": 1536,
}
# Gemma4Processor(image_seq_length=280): soft tokens one image adds to the text
_IMAGE_TOKENS = 280


def _layer_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """Gemma4TextConfig.__post_init__: five sliding layers then a full one; the last layer is forced full."""
    lt = list(
        layer_types_explicit(r, n)
        or ("sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n))
    )
    lt[-1] = "full_attention"
    return tuple(lt)


def _kv_shared(r: ConfigReader, layer_types: tuple[str, ...]) -> tuple[int, ...]:
    """Gemma4TextConfig.kv_sharing_modes: the last ``num_kv_shared_layers`` layers reuse the last unshared
    layer of their type, which must exist."""
    n, shared = len(layer_types), r.int("num_kv_shared_layers", minimum=0)
    if shared >= n or (shared and set(layer_types[: n - shared]) != set(layer_types)):
        raise GpumemInputError(
            f"must leave every layer type an unshared layer among the {n} layers, got {shared}",
            source=r.source,
            field="num_kv_shared_layers",
        )
    return tuple(range(n - shared, n))


def _global_heads(r: ConfigReader, lt: tuple[str, ...], kv: int, k_eq_v: bool) -> tuple[int, int]:
    """(head dim, KV heads) of the full layers: ``per_layer_config`` when the file has one, else
    ``global_head_dim`` and (with attention_k_eq_v only) ``num_global_key_value_heads``."""
    d = r.int("global_head_dim")
    g = r.get("num_global_key_value_heads", default=None)
    heads = r.int("num_global_key_value_heads") if g is not None and k_eq_v else kv
    plc = r.get("per_layer_config", default=None)
    if plc is None:
        return d, heads
    if not isinstance(plc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="per_layer_config")
    full = {i for i, t in enumerate(lt) if t == "full_attention"}
    over = {}
    for k, v in plc.items():
        idx = int(k) if str(k).isascii() and str(k).isdigit() else -1
        if idx not in full or not isinstance(v, Mapping) or set(v) - {"head_dim", "num_key_value_heads"}:
            raise GpumemInputError(
                f"only full-attention layers' head_dim / num_key_value_heads are modelled, got {short(k)}",
                source=r.source,
                field="per_layer_config",
            )
        over[idx] = (v.get("head_dim", r.int("head_dim")), v.get("num_key_value_heads", kv))
    if set(over) != full or len(set(over.values())) != 1:
        raise GpumemInputError(
            "full-attention layers with different head dims are not modelled",
            source=r.source,
            field="per_layer_config",
        )
    d, heads = next(iter(over.values()))
    for what, v in (("head_dim", d), ("num_key_value_heads", heads)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise GpumemInputError(
                f"{what} must be a positive int, got {short(v)}", source=r.source, field="per_layer_config"
            )
    return d, heads


def _moe(r: ConfigReader) -> MoESpec | None:
    if not r.bool("enable_moe_block", default=False):
        return None
    return MoESpec(
        num_experts=r.int("num_experts"),
        experts_per_token=r.int("top_k_experts"),
        expert_intermediate_size=r.int("moe_intermediate_size"),
    )


def gemma4_text(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    r = ConfigReader({**_TEXT_DEFAULTS, **r.cfg}, r.source)
    for field in ("attention_bias",):
        if r.bool(field, default=False):
            raise GpumemInputError(
                "biased projections are not modelled for Gemma 4", source=r.source, field=field
            )
    if r.get("use_bidirectional_attention", default=None) is not None:
        raise GpumemInputError(
            "bidirectional Gemma 4 (an encoder) is not modelled",
            source=r.source,
            field="use_bidirectional_attention",
        )
    f = common(r, name, mt, activation=str(r.get("hidden_activation")))
    n = f["num_layers"]
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    f["norms_per_layer"] = 4  # input, post_attention, pre_feedforward, post_feedforward
    f["qk_norm"] = "per_head"  # q_norm, k_norm; v_norm has no weight
    cap = r.get("final_logit_softcapping", default=None)
    f["final_logit_softcapping"] = (
        positive_number(cap, r.source, "final_logit_softcapping") if cap is not None else None
    )
    lt = f["layer_types"] = _layer_types(r, n)
    f["sliding_window"] = r.int("sliding_window")
    f["kv_shared_layers"] = _kv_shared(r, lt)
    k_eq_v = r.bool("attention_k_eq_v", default=False)
    gd, gkv = _global_heads(r, lt, f["num_kv_heads"], k_eq_v)
    if f["num_attention_heads"] % gkv:
        raise GpumemInputError(
            f"num_attention_heads ({f['num_attention_heads']}) must be a multiple of it, got {gkv}",
            source=r.source,
            field="num_global_key_value_heads",
        )
    per_layer = r.get("hidden_size_per_layer_input", default=0) or 0
    f["gemma4"] = Gemma4Spec(
        global_head_dim=gd,
        global_kv_heads=gkv,
        k_eq_v=k_eq_v,
        per_layer_input_size=r.int("hidden_size_per_layer_input", minimum=0) if per_layer else 0,
        per_layer_vocab_size=r.int("vocab_size_per_layer_input"),
        double_wide_mlp=r.bool("use_double_wide_mlp", default=False),
    )
    f["moe"] = _moe(r)
    return f


def _sub(r: ConfigReader, key: str, defaults: Mapping[str, Any]) -> ConfigReader | None:
    """A tower's config over its class defaults; None when missing or null (no tower)."""
    v = r.get(key, default=None)
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field=key)
    return ConfigReader({**defaults, **v}, f"{r.source} ({key})")


def vision_tower(v: ConfigReader) -> int:
    """Parameters of Gemma4VisionModel: the patch embedder (input_proj 3 p^2 -> h, the
    [2, position_embedding_size, h] table); per Gemma4VisionEncoderLayer q/k/v/o (no bias), q_norm and k_norm
    of head_dim, a gated MLP, four norms. The pooler has no weights; clipped linears' bounds are buffers."""
    h, a, kvh, d = (
        v.int("hidden_size"),
        v.int("num_attention_heads"),
        v.int("num_key_value_heads"),
        v.int("head_dim"),
    )
    layer = 2 * a * d * h + 2 * kvh * d * h + 2 * d + 3 * h * v.int("intermediate_size") + 4 * h
    table = 2 * v.int("position_embedding_size") * h
    return 3 * v.int("patch_size") ** 2 * h + table + v.int("num_hidden_layers") * layer


def audio_tower(u: ConfigReader) -> int:
    """Gemma4AudioModel: the subsampling convs (3x3, no bias) with bias-free LayerNorms and input_proj_linear;
    per Gemma4AudioLayer two feed-forwards (h -> 4h -> h and two norms each), the attention (q, k, v, post,
    relative_k_proj, per_dim_scale), the light conv (linear_start h -> 2h, linear_end, a depthwise conv, two
    norms) and three norms; output_proj (biased)."""
    h, a, k = u.int("hidden_size"), u.int("num_attention_heads"), u.int("conv_kernel_size")
    ch = u.get("subsampling_conv_channels")
    if (
        not isinstance(ch, list)
        or len(ch) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in ch)
    ):
        raise GpumemInputError(
            f"must be two positive ints, got {short(ch)}", source=u.source, field="subsampling_conv_channels"
        )
    c0, c1 = ch
    sub = 9 * c0 + c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * h
    w = a * (h // a)
    ff = 2 * 4 * h * h + 2 * h
    layer = 2 * ff + (3 * w * h + h * h + w * h + h // a) + (3 * h * h + h * k + 2 * h) + 3 * h
    out = u.int("output_proj_dims")
    return sub + u.int("num_hidden_layers") * layer + h * out + out


def gemma4(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Gemma4Config: the text model from ``text_config`` (its defaults when missing); ``tie_word_embeddings``
    is the wrapper's (default True); the towers and embedders counted into VisionSpec."""
    tc = r.get("text_config", default={})
    if not isinstance(tc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    f = gemma4_text(ConfigReader(dict(tc), f"{r.source} (text_config)"), name, mt)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    th = f["hidden_size"]
    tower = projector = 0
    if (v := _sub(r, "vision_config", _VISION_DEFAULTS)) is not None:
        tower = vision_tower(v)
        projector += v.int("hidden_size") * th  # embed_vision.embedding_projection (its norm has no weight)
    if (u := _sub(r, "audio_config", _AUDIO_DEFAULTS)) is not None:
        tower += audio_tower(u)
        projector += u.int("output_proj_dims") * th
    if tower + projector > MAX_SIZE:
        raise GpumemInputError(
            f"the towers would have {tower + projector:,} parameters; gpumem describes up to {MAX_SIZE:,}",
            source=r.source,
            field="vision_config",
        )
    if tower or projector:  # the position table is an nn.Parameter (Gemma4VisionPatchEmbedder), in the tower
        f["vision"] = VisionSpec(
            kind="gemma4_vision_audio" if u is not None else "gemma4_vision",
            tower_params=tower,
            projector_params=projector,
            image_tokens=_IMAGE_TOKENS if v is not None else 0,
        )
    return f
