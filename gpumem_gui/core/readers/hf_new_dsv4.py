"""Reader of DeepSeek-V4 (``deepseek_v4``: transformers 5.24
``models/deepseek_v4/configuration_deepseek_v4.py`` for the fields, defaults and ``__post_init__``'s
legacy keys, ``modeling_deepseek_v4.py`` for the layers):
sliding-window, compressed-sparse (CSA) and heavily-compressed (HCA) attention layers with one shared K=V
head, the grouped output projection, the manifold-constrained hyper-connections and a MoE block of routed
experts plus one shared MLP (its parameters and cache: spec/compressed.py), gathered into the one reader
table by :mod:`.new_types`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, common
from gpumem_gui.core.spec.compressed import CompressedAttentionSpec, DeepseekV4Spec
from gpumem_gui.core.spec.model import MoESpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# DeepseekV4Config class defaults (configuration_deepseek_v4.py) of the fields read here
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 4096,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "head_dim": 512,
    "q_lora_rank": 1024,
    "num_experts_per_tok": 6,
    "n_routed_experts": 256,
    "max_position_embeddings": 1048576,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "sliding_window": 128,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
# configuration_deepseek_v4.py _COMPRESS_RATIO_TO_LAYER_TYPE: a legacy compress_ratios entry's layer type
_RATIO_TYPES = {0: "sliding_attention", 4: CSA, 128: HCA}
_LAYER_TYPES = ("sliding_attention", CSA, HCA)  # DEEPSEEK_V4_LAYER_TYPES
_DEFAULT_HASH_LAYERS = 3  # DeepseekV4Config.default_num_hash_layers


def _rates(r: ConfigReader) -> tuple[int, int]:
    """compress_rates (default {CSA: 4, HCA: 128}), the legacy compress_rate_csa / compress_rate_hca folded
    in as __post_init__ does."""
    rates = r.get("compress_rates", default=None) or {CSA: 4, HCA: 128}
    if not isinstance(rates, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="compress_rates")
    csa = r.get("compress_rate_csa", default=None) or rates.get(CSA, 4)
    hca = r.get("compress_rate_hca", default=None) or rates.get(HCA, 128)
    for key, v in (("compress_rates", csa), ("compress_rates", hca)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
            raise GpumemInputError(
                f"rates must be ints in 1..{1 << 20}, got {short(v)}", source=r.source, field=key
            )
    return csa, hca


def _layer_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """layer_types, else the legacy per-layer compress_ratios (0 / 4 / 128), else two HCA layers then CSA on
    odd and HCA on even indices (__post_init__); truncated to the layers (the MTP slot is dropped)."""
    explicit, ratios = r.get("layer_types", default=None), r.get("compress_ratios", default=None)
    if explicit is None and ratios is not None:
        if not isinstance(ratios, list) or not all(
            not isinstance(x, bool) and x in _RATIO_TYPES for x in ratios
        ):
            raise GpumemInputError(
                f"must list 0, 4 or 128 per layer, got {short(ratios)}",
                source=r.source,
                field="compress_ratios",
            )
        explicit, field = [_RATIO_TYPES[x] for x in ratios], "compress_ratios"
    else:
        field = "layer_types"
    if explicit is None:
        return tuple([HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))])
    if not isinstance(explicit, list) or len(explicit) < n or not set(explicit[:n]) <= set(_LAYER_TYPES):
        raise GpumemInputError(
            f"must name one of {', '.join(_LAYER_TYPES)} for each of the {n} layers, got {short(explicit)}",
            source=r.source,
            field=field,
        )
    return tuple(explicit[:n])


def _rotary_dim(r: ConfigReader, head_dim: int) -> int:
    """int(head_dim x partial_rotary_factor): the config's factor, else the legacy qk_rope_head_dim /
    head_dim, else 64 / 512 (DeepseekV4Config.default_partial_rotary_factor)."""
    factor = r.get("partial_rotary_factor", default=None)
    if factor is None:
        rope = r.get("qk_rope_head_dim", default=None)
        factor = rope / head_dim if isinstance(rope, int) and not isinstance(rope, bool) else 64 / 512
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise GpumemInputError(
            f"must be a number in (0, 1], got {short(factor)}", source=r.source, field="partial_rotary_factor"
        )
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise GpumemInputError(
            f"gives {dim} rotary channels of head_dim {head_dim}; an even count of at least 2 is needed",
            source=r.source,
            field="partial_rotary_factor",
        )
    return dim


def _hash_layers(r: ConfigReader, n: int) -> tuple[int, ...]:
    """mlp_layer_types ("hash_moe" / "moe"), else the first num_hash_layers (default 3) hash_moe."""
    types = r.get("mlp_layer_types", default=None)
    if types is None:
        return tuple(range(min(n, r.int("num_hash_layers", default=_DEFAULT_HASH_LAYERS, minimum=0))))
    if not isinstance(types, list) or len(types) < n or not set(types[:n]) <= {"hash_moe", "moe"}:
        raise GpumemInputError(
            f"must name 'hash_moe' or 'moe' for each of the {n} layers, got {short(types)}",
            source=r.source,
            field="mlp_layer_types",
        )
    return tuple(i for i, t in enumerate(types[:n]) if t == "hash_moe")


def deepseek_v4(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """DeepseekV4Config -> ModelSpec fields: one shared K=V head of ``head_dim`` (num_key_value_heads is not
    read by the modeling code), the shared MLP of moe_intermediate_size (attribute_map)."""
    given = {k: v for k, v in r.cfg.items() if v is not None}
    # attribute_map: intermediate_size is moe_intermediate_size (DeepseekV4MLP, the shared MLP, reads it)
    width = given.get(
        "moe_intermediate_size", given.get("intermediate_size", _DEFAULTS["moe_intermediate_size"])
    )
    r = ConfigReader(
        {**_DEFAULTS, **given, "moe_intermediate_size": width, "intermediate_size": width}, r.source
    )
    if r.bool("mlp_bias", default=False):
        raise GpumemInputError(
            "biased MLPs are not modelled for DeepSeek-V4", source=r.source, field="mlp_bias"
        )
    f = common(r, name, mt, num_kv_heads=1)
    n, a, d = f["num_layers"], f["num_attention_heads"], r.int("head_dim")
    groups = r.int("o_groups")
    if a % groups:  # DeepseekV4GroupedLinear: heads x head_dim / o_groups inputs per group
        raise GpumemInputError(
            f"must divide num_attention_heads ({a}), got {groups}", source=r.source, field="o_groups"
        )
    csa, hca = _rates(r)
    types = _layer_types(r, n)
    window = r.int("sliding_window")
    attention = CompressedAttentionSpec(
        layer_types=types,  # type: ignore[arg-type]
        head_dim=d,
        index_head_dim=r.int("index_head_dim"),
        sliding_window=window,
        csa_rate=csa,
        hca_rate=hca,
    )
    f.update(
        head_dim=d,
        rotary_dim=_rotary_dim(r, d),
        layer_types=types,
        sliding_window=window,
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        moe=MoESpec(
            num_experts=r.int("n_routed_experts"),
            experts_per_token=r.int("num_experts_per_tok"),
            expert_intermediate_size=r.int("moe_intermediate_size"),
            shared_expert_intermediate_size=r.int("moe_intermediate_size"),
        ),
        deepseek_v4=DeepseekV4Spec(
            attention=attention,
            q_lora_rank=r.int("q_lora_rank"),
            o_groups=groups,
            o_lora_rank=r.int("o_lora_rank"),
            index_n_heads=r.int("index_n_heads"),
            index_topk=r.int("index_topk"),
            hc_mult=r.int("hc_mult"),
            hc_sinkhorn_iters=r.int("hc_sinkhorn_iters"),
            hash_layers=_hash_layers(r, n),
        ),
    )
    return f


READERS["deepseek_v4"] = deepseek_v4
# DeepseekV4TopKRouter / DeepseekV4HashRouter: F.linear on the bf16 hidden states (no fp32 router)
# DeepseekV4Model.forward (hyper-connection streams, replay/dsv4.py); DeepseekV4PreTrainedModel has no SDPA
# path (_supports_sdpa = False: eager); DeepseekV4Experts._apply_gate clamps both halves (swiglu_limit)
TRAITS["deepseek_v4"] = {
    "model_forward": "deepseek_v4",
    "sdpa_supported": False,
    "experts_gate": "clamped_act_mul",
}
