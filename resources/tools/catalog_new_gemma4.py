"""Catalog entries of the model types issue 14 adds, group gemma: Gemma 4 (``gemma4``, the multimodal
checkpoints as published), with the parameter count the publisher states and its source; build_model_catalog
checks each against the exact count (text model, vision tower, audio tower and their embedders together, as
the checkpoint holds them)."""

from __future__ import annotations

from catalog_published import Model, Published, stated

_CARD = "https://huggingface.co/google/gemma-4-{size}-it (model card, parameter table; recalled, not re-read)"
_HUB = (
    "https://huggingface.co/google/gemma-4-31B-it (Hub 'Model size', the safetensors' BF16 count "
    "31,273,088,876 as quoted in a public test)"
)


def _e(size: str, figure: str, text: str, towers: str) -> Model:
    note = (
        f"The card's count 'with embeddings' includes the vision and audio towers ({towers}); the text model "
        f"alone is {text} (its per-layer embedding table included)."
    )
    return Model(f"google/gemma-4-{size}-it", "Gemma 4", size, stated(figure, _CARD.format(size=size), note))


MODELS: tuple[Model, ...] = (
    _e("E2B", "5.1B", "4.63B", "0.48B"),
    _e("E4B", "8B", "7.46B", "0.48B"),
    Model(
        "google/gemma-4-26B-A4B-it",
        "Gemma 4",
        "26B-A4B",
        Published(
            25_750_000_000,
            0.01,
            _CARD.format(size="26B-A4B") + " ('25.2B' for the language model, '~550M' for the vision tower)",
            "The card states the language model (25.23B, 3.8B active) and the vision encoder (~550M; with "
            "its embedder 0.573B) apart; the sum is precise to the encoder's rounding (1 %).",
        ),
    ),
    Model(
        "google/gemma-4-31B-it",
        "Gemma 4",
        "31B",
        stated(
            "31.27B",
            _HUB,
            "The safetensors also hold 2,364 buffer elements (the vision standardisation's std_bias and "
            "std_scale, 2 x 1152, and one layer_scalar per decoder layer, 60); the text model alone is "
            "30.70B (the card's '30.7B').",
        ),
    ),
)
