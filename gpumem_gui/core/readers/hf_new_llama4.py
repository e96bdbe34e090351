"""Readers of the model types issue 14 adds, group llama4: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.readers.config_fields import ConfigReader

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}
