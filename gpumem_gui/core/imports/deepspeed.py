"""DeepSpeed config JSON files (``ds_config.json``: ``zero_optimization``, ``bf16``/``fp16``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``), read as a :class:`TrainingRun` with
framework ``deepspeed``. Keys as ``deepspeed/runtime/config.py`` and ``deepspeed/runtime/zero/config.py``
(``DeepSpeedZeroConfig``) declare them; ``"auto"`` is the Hugging Face integration's "fill from the Trainer"
(``transformers/integrations/deepspeed.py HfTrainerDeepSpeedConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.imports.base import ImportedRun, Reading
from gpumem_gui.core.imports.keys import Keys
from gpumem_gui.core.imports.train_common import deepspeed_dict

_KEYS = (
    "zero_optimization",
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "zero_allow_untested_optimizer",
)


class DeepSpeedConfig:
    name = "DeepSpeed config"

    def matches(self, data: Mapping[str, Any], path: str) -> bool:
        return any(k in data for k in _KEYS)

    def parse(self, data: Mapping[str, Any], path: str) -> ImportedRun:
        r = Reading("DeepSpeed config", file=path)
        r.fields["framework"] = "deepspeed"
        deepspeed_dict(Keys(data, r), r)
        r.missing_model("model", "a DeepSpeed config names none")
        return r.training(None)


PARSERS = (DeepSpeedConfig(),)
