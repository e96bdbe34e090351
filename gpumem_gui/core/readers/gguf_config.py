"""A GGUF file's architecture metadata as the ``config.json`` transformers would read, then the config path.

As transformers does for GGUF checkpoints (``integrations/ggml.py`` ``GGUF_CONFIG_MAPPING``), each
``{arch}.*`` metadata key maps onto a config key (``embedding_length`` -> ``hidden_size``,
``block_count`` -> ``num_hidden_layers``, ...); what a config says in a flag but a GGUF file only shows by
its tensors (biases, a tied head, which layers hold experts, Falcon's second norm) is read from the tensor
list. The config then goes through :func:`~gpumem_gui.core.readers.hf_config.spec_from_config`, so a GGUF
model and its ``config.json`` are described by the same code. Values are checked here first, so an error
names the GGUF key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.model import ModelSpec, Provenance

# GGUF architecture (llama.cpp ``LLM_ARCH_*`` names, gguf-py constants.py MODEL_ARCH_NAMES) -> the
# Hugging Face model_type whose modeling code builds the same tensors (see hf_config.READERS).
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "granite": "granite",
    "qwen2": "qwen2",
    "qwen2moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "deepseek2": "deepseek_v2",
    "gpt2": "gpt2",
    "falcon": "falcon",
    "bloom": "bloom",
    "gptneox": "gpt_neox",
    "olmo2": "olmo2",
    "starcoder2": "starcoder2",
}

# {arch}.<key> -> config.json key, for every architecture (transformers GGUF_CONFIG_MAPPING's common rows)
_COMMON_KEYS = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "feed_forward_length": "intermediate_size",
    "context_length": "max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
# where a config class spells them its own way (GPT2Config, BloomConfig, FalconConfig)
_RENAMED = {
    "gpt2": {"embedding_length": "n_embd", "block_count": "n_layer", "attention.head_count": "n_head"},
    "bloom": {"block_count": "n_layer", "attention.head_count": "n_head", "context_length": "seq_length"},
    "falcon": {"feed_forward_length": "ffn_hidden_size"},
}
_KEEP_FLOAT = {"attention.layer_norm_rms_epsilon", "final_logit_softcapping", "attn_logit_softcapping"}

# Sliding-window layer period when the file has no ``attention.sliding_window_pattern``: llama.cpp
# src/llama-model.cpp ``hparams.set_swa_pattern(2)`` (Gemma 2) and ``set_swa_pattern(6)`` (Gemma 3);
# layer i is full attention when (i + 1) % period == 0.
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6}
# Architectures where a ``sliding_window`` key means every layer slides (as in config_fields.uniform_sliding).
_UNIFORM_SWA_ARCHS = frozenset({"llama", "mistral", "phi3", "starcoder2"})


class NotDescribable(Exception):
    """The file is well formed but its architecture does not fit a ModelSpec."""


class GgufMeta:
    """Typed access to a GGUF file's metadata and tensor shapes; errors name the file and the key."""

    def __init__(
        self, path: Path, raw: Callable[[str], Any], counts: Mapping[str, int], shapes: Mapping[str, tuple]
    ) -> None:
        self.path = path
        self.raw = raw  # key -> scalar, decoded string, kept array as a list, or None
        self.counts = counts  # array keys -> element count (tokenizer.ggml.tokens)
        self.shapes = shapes  # tensor name -> shape (outermost first)
        self.arch = ""
        self.config: dict[str, Any] | None = None  # the mapped config.json, once built

    def err(self, message: str, key: str) -> GpumemInputError:
        return GpumemInputError(message, source=str(self.path), field=key)

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, tensor: str) -> bool:
        return tensor in self.shapes

    def string(self, key: str) -> str | None:
        v = self.raw(key)
        return v if isinstance(v, str) else None

    def integer(self, key: str, *, required: bool = False, minimum: int = 1) -> int | None:
        """An integer, or a per-layer integer array whose entries are all equal."""
        v = self.raw(key)
        if v is None:
            if required:
                raise self.err("required key is missing", key)
            return None
        if isinstance(v, list):
            if not v or len(set(v)) != 1:
                raise NotDescribable(f"{key} varies per layer")
            v = v[0]
        # a FLOAT32 key may hold inf or nan, which int() refuses (OverflowError, ValueError)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or int(v) != v:
            raise self.err(f"must be an integer, got {short(v)}", key)
        if v < minimum:
            raise self.err(f"must be >= {minimum}, got {short(v)}", key)
        return int(v)

    def number(self, key: str) -> float | None:
        v = self.raw(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.err(f"must be a finite number, got {short(v)}", key)
        return float(v)

    def flag(self, key: str) -> bool | None:
        v = self.raw(key)
        return v if isinstance(v, bool) else None


def spec_from_gguf_meta(meta: GgufMeta, arch: str) -> ModelSpec | None:
    """The spec of a GGUF file of architecture ``arch``: its metadata mapped onto a config, then the config
    path. None when the file's architecture does not fit a spec (per-layer head counts, ...)."""
    meta.arch = arch
    try:
        cfg = meta.config = gguf_config(meta)
    except NotDescribable:
        return None
    name = (meta.string("general.name") or "").strip() or meta.path.stem or "model"
    try:
        return spec_from_config(
            cfg,
            name=name[:200],
            source=str(meta.path),
            provenance=Provenance(kind="gguf", source=str(meta.path), note=f"general.architecture={arch}"),
        )
    except GpumemInputError as e:  # name the GGUF key the config value came from
        names = {**_COMMON_KEYS, **_RENAMED.get(arch, {})}
        suffix = next((k for k, v in names.items() if v == e.field), None)
        if suffix is not None:
            e.field = meta.key(suffix)
        raise


def gguf_config(meta: GgufMeta) -> dict[str, Any]:
    """The ``config.json`` dict a GGUF file's metadata and tensors describe (see the module docstring)."""
    arch = meta.arch
    cfg: dict[str, Any] = {"model_type": GGUF_ARCHITECTURES[arch]}
    names = {**_COMMON_KEYS, **_RENAMED.get(arch, {})}
    for suffix, key in names.items():
        value = meta.number(meta.key(suffix)) if suffix in _KEEP_FLOAT else meta.integer(meta.key(suffix))
        if value is not None:
            cfg[key] = value
    h = cfg[names["embedding_length"]] = meta.integer(meta.key("embedding_length"), required=True)
    n_layers = cfg[names["block_count"]] = meta.integer(meta.key("block_count"), required=True)
    heads = cfg[names["attention.head_count"]] = meta.integer(meta.key("attention.head_count"), required=True)
    assert h is not None and n_layers is not None and heads is not None
    _check_blocks(meta, n_layers)
    kv = meta.integer(meta.key("attention.head_count_kv")) or heads
    cfg["num_key_value_heads"] = kv
    cfg["head_dim"] = _head_dim(meta, h, heads)
    cfg["vocab_size"] = _vocab(meta)
    cfg["tie_word_embeddings"] = not meta.has("output.weight")
    pos_rows = meta.shapes["position_embd.weight"][0] if meta.has("position_embd.weight") else 0
    if pos_rows and "max_position_embeddings" not in cfg:
        cfg["max_position_embeddings"] = pos_rows
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        cap = meta.number(meta.key(key))
        if cap is not None:
            cfg[key] = cap
    cfg.update(_sliding(meta, n_layers))
    cfg.update(_ARCH_KEYS.get(arch, _attention_flags)(meta, cfg))
    cfg.update(_moe(meta, cfg, n_layers))
    if names["feed_forward_length"] not in cfg:
        raise meta.err("required key is missing", meta.key("feed_forward_length"))
    return cfg


def _check_blocks(meta: GgufMeta, n_layers: int) -> None:
    """Every architecture described here stores tensors for each block as blk.<i>.*; the block count must
    name exactly those."""
    # an index of more than 9 digits (the parser already refuses names of 64 bytes or more) is no block of
    # the at most MAX_LAYERS the spec allows; it counts as a block, which makes the numbering have gaps
    layer_ids = {
        int(p[1]) if len(p[1]) <= 9 else -1
        for p in (n.split(".") for n in meta.shapes)
        if len(p) > 1 and p[0] == "blk" and p[1].isascii() and p[1].isdecimal()
    }
    if layer_ids != set(range(len(layer_ids))) or len(layer_ids) != n_layers:
        raise meta.err(
            f"is {n_layers} but the file has tensors for {len(layer_ids)} blocks"
            + ("" if layer_ids == set(range(len(layer_ids))) else " with gaps in their numbering"),
            meta.key("block_count"),
        )


def _head_dim(meta: GgufMeta, h: int, heads: int) -> int:
    key_len = meta.integer(meta.key("attention.key_length"))
    if key_len is not None:
        return key_len
    if h % heads:
        raise meta.err(
            f"{h} is not divisible by the head count {heads} and no key_length is given",
            meta.key("embedding_length"),
        )
    return h // heads


def _vocab(meta: GgufMeta) -> int:
    embd = meta.shapes.get("token_embd.weight")
    vocab = (
        meta.integer(meta.key("vocab_size"))
        or (embd[0] if embd else None)
        or meta.counts.get("tokenizer.ggml.tokens")
    )
    if not vocab:
        raise meta.err(
            "no vocab_size key, token_embd.weight or tokenizer.ggml.tokens", meta.key("vocab_size")
        )
    return vocab


def _sliding(meta: GgufMeta, n_layers: int) -> dict[str, Any]:
    """Explicit ``layer_types`` and ``sliding_window`` (null when no layer slides, so no config class
    default applies); Qwen's reader also needs ``use_sliding_window``."""
    off = {"sliding_window": None, "use_sliding_window": False}
    window = meta.integer(meta.key("attention.sliding_window"), minimum=0) or None
    if window is None:
        return off
    pattern = meta.raw(meta.key("attention.sliding_window_pattern"))
    if isinstance(pattern, list):
        # convert_hf_to_gguf.py writes one bool per layer: True where the layer slides
        if len(pattern) != n_layers or not all(isinstance(b, bool) for b in pattern):
            raise meta.err(
                f"must list one bool per layer ({n_layers})", meta.key("attention.sliding_window_pattern")
            )
        slides = list(pattern)
    else:
        period: int | None = _SWA_PERIOD.get(meta.arch)
        if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
            period = pattern
        if period is not None:
            slides = [bool((i + 1) % period) for i in range(n_layers)]
        elif meta.arch in _UNIFORM_SWA_ARCHS:
            slides = [True] * n_layers
        else:
            return off
    if not any(slides):
        return off
    types = ["sliding_attention" if s else "full_attention" for s in slides]
    return {"sliding_window": window, "use_sliding_window": True, "layer_types": types}


def _attention_flags(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """LlamaConfig-style flags: attention_bias (q/k/v/o), mlp_bias (the dense MLP's projections)."""
    first_dense = _first_dense(meta, cfg)
    return {
        "attention_bias": any(meta.has(f"blk.0.{t}.bias") for t in ("attn_q", "attn_qkv", "attn_q_a")),
        "mlp_bias": first_dense is not None
        and (meta.has(f"blk.{first_dense}.ffn_up.bias") or meta.has(f"blk.{first_dense}.ffn_down.bias")),
    }


def _first_dense(meta: GgufMeta, cfg: Mapping[str, Any]) -> int | None:
    n_layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0
    return next((i for i in range(n_layers) if not meta.has(f"blk.{i}.ffn_gate_inp.weight")), None)


def _gpt2(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    pos = meta.shapes["position_embd.weight"][0] if meta.has("position_embd.weight") else None
    out: dict[str, Any] = {"n_inner": cfg.get("intermediate_size")}
    if pos or cfg.get("max_position_embeddings"):
        out["n_positions"] = pos or cfg["max_position_embeddings"]
    return out


def _falcon(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """FalconConfig: the new decoder architecture (Falcon-40B) has a second norm and grouped K/V heads;
    llama.cpp converts only the parallel-attention variants."""
    new_arch = meta.has("blk.0.attn_norm_2.weight")
    kv = cfg["num_key_value_heads"]
    return {
        "new_decoder_architecture": new_arch,
        "num_kv_heads": kv,
        "multi_query": kv == 1,
        "parallel_attn": True,
        "bias": meta.has("blk.0.attn_qkv.bias"),
    }


def _gpt_neox(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    parallel = meta.flag(meta.key("use_parallel_residual"))
    return {"attention_bias": meta.has("blk.0.attn_qkv.bias"), "use_parallel_residual": parallel is not False}


def _starcoder2(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {"use_bias": meta.has("blk.0.attn_q.bias")}


def _deepseek2(meta: GgufMeta, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """MLA sizes: llama.cpp since the MLA rework writes key/value_length for the compressed cache and the
    per-head sizes as key_length_mla / value_length_mla; older files only the per-head sizes."""
    rope = meta.integer(meta.key("rope.dimension_count"), required=True)
    k_mla = meta.integer(meta.key("attention.key_length_mla")) or cfg["head_dim"]
    v_mla = meta.integer(meta.key("attention.value_length_mla")) or meta.integer(
        meta.key("attention.value_length"), required=True
    )
    assert rope is not None and v_mla is not None
    if k_mla <= rope:
        raise meta.err(
            f"key length {k_mla} must exceed the rope dimension {rope}", meta.key("attention.key_length")
        )
    out = _attention_flags(meta, cfg)
    out.update(
        q_lora_rank=meta.integer(meta.key("attention.q_lora_rank"), minimum=0) or None,
        kv_lora_rank=meta.integer(meta.key("attention.kv_lora_rank"), required=True),
        qk_nope_head_dim=k_mla - rope,
        qk_rope_head_dim=rope,
        v_head_dim=v_mla,
    )
    return out


_ARCH_KEYS: dict[str, Callable[[GgufMeta, Mapping[str, Any]], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "bloom": lambda meta, cfg: {},
    "falcon": _falcon,
    "gptneox": _gpt_neox,
    "starcoder2": _starcoder2,
    "deepseek2": _deepseek2,
}


def _moe(meta: GgufMeta, cfg: dict[str, Any], n_layers: int) -> dict[str, Any]:
    """Experts, in each config class's own keys; which layers hold them comes from the router tensors."""
    experts = meta.integer(meta.key("expert_count"), minimum=0) or 0
    if not experts:
        return {}
    used = meta.integer(meta.key("expert_used_count"), required=True)
    if used is not None and used > experts:
        raise meta.err(
            f"is {used}, more than the {experts} experts ({meta.key('expert_count')})",
            meta.key("expert_used_count"),
        )
    e_ff = meta.integer(meta.key("expert_feed_forward_length")) or cfg.get("intermediate_size")
    if e_ff is None:
        raise meta.err("required key is missing", meta.key("expert_feed_forward_length"))
    moe_layers = [i for i in range(n_layers) if meta.has(f"blk.{i}.ffn_gate_inp.weight")]
    dense = [i for i in range(n_layers) if i not in moe_layers] if moe_layers else []
    arch = meta.arch
    if arch == "llama":  # llama.cpp writes Mixtral as llama with experts
        return {
            "model_type": "mixtral",
            "num_local_experts": experts,
            "num_experts_per_tok": used,
            "intermediate_size": e_ff,
        }
    if arch == "deepseek2":
        first = min(moe_layers) if moe_layers else 0
        if dense != list(range(first)):
            raise NotDescribable("dense layers are not the leading ones")
        v3 = any(
            meta.has(f"blk.{i}.exp_probs_b.bias") or meta.has(f"blk.{i}.exp_probs_b") for i in moe_layers
        )
        return {
            "model_type": "deepseek_v3" if v3 else "deepseek_v2",
            "n_routed_experts": experts,
            "num_experts_per_tok": used,
            "moe_intermediate_size": e_ff,
            "n_shared_experts": meta.integer(meta.key("expert_shared_count"), minimum=0) or 0,
            "first_k_dense_replace": first,
            "intermediate_size": cfg.get("intermediate_size") or e_ff,
        }
    shared = meta.integer(meta.key("expert_shared_feed_forward_length"), minimum=0) or 0
    if not shared and any(meta.has(f"blk.{i}.ffn_up_shexp.weight") for i in moe_layers):
        shared = meta.shapes[f"blk.{moe_layers[0]}.ffn_up_shexp.weight"][0]
    return {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": e_ff,
        "shared_expert_intermediate_size": shared,
        "mlp_only_layers": dense,
        "decoder_sparse_step": 1,
        "intermediate_size": cfg.get("intermediate_size") or e_ff,
    }
