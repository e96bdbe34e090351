"""Catalog entries of the model types issue 14 adds, group vlm: family, size label and the parameter count the
publisher states, with its source; build_model_catalog checks each against the exact count (text model,
vision tower and projector together, as the checkpoint holds them)."""

from __future__ import annotations

from catalog_published import Model, stated

_HUB = "https://huggingface.co/{id} (Hub 'Model size', from the checkpoint's safetensors)"
_NOTE = "The count includes the vision tower and patch merger(s) ({vision}); the text model alone is {text}."


def _hub(model_id: str, family: str, size: str, figure: str, vision: str, text: str) -> Model:
    note = _NOTE.format(vision=vision, text=text)
    return Model(model_id, family, size, stated(figure, _HUB.format(id=model_id), note))


MODELS: tuple[Model, ...] = (
    _hub("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen2.5-VL", "7B", "8.29B", "0.68B", "7.62B"),
    _hub("Qwen/Qwen2.5-VL-72B-Instruct", "Qwen2.5-VL", "72B", "73.4B", "0.70B", "72.71B"),
    _hub("Qwen/Qwen3-VL-8B-Instruct", "Qwen3-VL", "8B", "8.77B", "0.58B", "8.19B"),
    _hub("Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen3-VL", "30B-A3B", "31.1B", "0.54B", "30.53B"),
)
