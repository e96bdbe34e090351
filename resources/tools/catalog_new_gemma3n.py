"""Catalog entries of the multimodal Gemma 3n checkpoints (``gemma3n``, issue 14): the count the model card
states and its source; build_model_catalog checks each against the exact count (text model with its
per-layer embedding table, the timm MobileNetV5 vision tower, the audio conformer and both embedders, as the
checkpoint holds them: validation/gemma3n_towers.py)."""

from __future__ import annotations

from catalog_published import Model, label

_CARD = (
    "https://huggingface.co/google/gemma-3n-{size}-it (model card: 'the raw parameter count of this model is "
    "{figure}')"
)
# a whole-billion figure on the card covers +-0.5B: 10 % at 5B, 6.25 % at 8B
_NOTE = "Text model {text}, vision tower 0.29B, audio tower 0.68B, embedders 0.008B."


def _card(size: str, figure: str, text: str, precision: float) -> Model:
    published = label(figure, _CARD.format(size=size, figure=figure), _NOTE.format(text=text), precision)
    return Model(f"google/gemma-3n-{size}-it", "Gemma 3n", size, published)


MODELS: tuple[Model, ...] = (
    _card("E2B", "5B", "4.44B", 0.1),
    _card("E4B", "8B", "6.84B", 0.0625),
)
