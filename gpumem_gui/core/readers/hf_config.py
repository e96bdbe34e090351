"""Hugging Face ``config.json`` -> :class:`ModelSpec`, per ``model_type``.

Each supported ``model_type`` has a reader that knows which fields its transformers config class uses,
which defaults apply when ``save_pretrained`` left a field out (serialized configs omit values equal to
the base-class defaults, e.g. ``tie_word_embeddings: true``), and which tensors its modeling code builds
(biases, extra norms, fused experts). Defaults below are those of the transformers config classes
(``src/transformers/models/<type>/configuration_<type>.py``, transformers 5.x).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.readers import hf_legacy as legacy
from gpumem_gui.core.readers import hf_modern as modern
from gpumem_gui.core.readers.config_fields import Config, ConfigReader
from gpumem_gui.core.readers.generic import generic_fields
from gpumem_gui.core.readers.new_types import NEW_READERS
from gpumem_gui.core.readers.reading import read_json_file
from gpumem_gui.core.readers.traits import traits_for
from gpumem_gui.core.spec.model import ModelSpec, Provenance

READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    "llama": modern._llama,
    "granite": modern._llama,
    "mistral": modern._mistral,
    "mixtral": modern._mixtral,
    "qwen2": modern._qwen2,
    "qwen2_moe": modern._qwen2,
    "qwen3": modern._qwen3,
    "qwen3_moe": modern._qwen3,
    "gemma": modern._gemma,
    "gemma2": modern._gemma,
    "gemma3_text": modern._gemma,
    "gemma3": modern._gemma3,
    "phi3": modern._phi3,
    "olmo2": modern._olmo2,
    "starcoder2": modern._starcoder2,
    "deepseek_v2": modern._deepseek,
    "deepseek_v3": modern._deepseek,
    "gpt2": legacy._gpt2,
    "opt": legacy._opt,
    "bloom": legacy._bloom,
    "falcon": legacy._falcon,
    "gpt_neox": legacy._gpt_neox,
    **NEW_READERS,
}

SUPPORTED_MODEL_TYPES = tuple(sorted(READERS))


def spec_from_config(
    cfg: Config, *, name: str, source: str = "config.json", provenance: Provenance | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` dict; a ``model_type`` no reader describes is
    read as a generic decoder, flagged approximate (:mod:`gpumem_gui.core.readers.generic`)."""
    if not isinstance(cfg, Mapping):
        raise GpumemInputError("a config.json must hold a JSON object", source=source)
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise GpumemInputError(
            "no model_type; is this a Hugging Face config.json?", source=source, field="model_type"
        )
    reader = READERS.get(mt)
    try:  # the readers build nested specs (MoESpec, MLASpec) whose checks may fail too
        if reader is None:  # the reader of last resort: approximate, or NotModelled naming the field
            fields = generic_fields(cfg, mt, name, source, READERS)
        else:
            fields = reader(ConfigReader(cfg, source), name, mt)
            fields["traits"] = traits_for(mt, cfg, source)
        fields["provenance"] = provenance or Provenance(kind="config.json", source=source)
        return ModelSpec(**fields)
    except ValidationError as e:
        raise describe_validation_error(e, source=source) from None


def load_config_file(path: Path) -> ModelSpec:
    """``config.json`` file -> spec, named after its folder (``org__name.json`` files: ``org/name``)."""
    cfg = read_json_file(path)
    stem = path.parent.name if path.name == "config.json" else path.stem
    name = stem.replace("__", "/") if stem else "model"
    return spec_from_config(cfg, name=name, source=str(path))
