"""The model types added by issue 14, gathered from their group modules (``hf_new_*.py``) for the one reader
table (:data:`~gpumem_gui.core.readers.hf_config.READERS`) and the one traits table
(:data:`~gpumem_gui.core.readers.traits.TRAITS`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.readers import (
    hf_encoders,
    hf_new_bamba,
    hf_new_dense_a,
    hf_new_dense_b,
    hf_new_dsv4,
    hf_new_gemma,
    hf_new_gpt_oss,
    hf_new_hybrid,
    hf_new_linear,
    hf_new_llama4,
    hf_new_mla,
    hf_new_mllama,
    hf_new_moe,
    hf_new_seq2seq,
    hf_new_ssm,
    hf_new_vlm,
)
from gpumem_gui.core.readers.config_fields import ConfigReader

_GROUPS = (
    hf_new_mla,
    hf_new_dsv4,
    hf_new_dense_a,
    hf_new_dense_b,
    hf_new_moe,
    hf_new_gpt_oss,
    hf_new_llama4,
    hf_new_hybrid,
    hf_new_linear,
    hf_encoders,
    hf_new_gemma,
    hf_new_vlm,
    hf_new_seq2seq,
    hf_new_ssm,
    hf_new_mllama,
    hf_new_bamba,
)

NEW_READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    k: v for g in _GROUPS for k, v in g.READERS.items()
}
NEW_TRAITS: dict[str, dict[str, Any]] = {k: v for g in _GROUPS for k, v in g.TRAITS.items()}
NEW_CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {
    k: v for g in _GROUPS for k, v in g.CONFIG_TRAITS.items()
}
