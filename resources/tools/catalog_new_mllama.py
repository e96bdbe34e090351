"""Catalog entries of the model types issue 14 adds, group mllama (Llama 3.2 Vision): family, size label and
the parameter count the publisher states, with its source; build_model_catalog checks each against the
exact count (text model with its cross-attention layers, vision tower and projector, as the checkpoint holds
them)."""

from __future__ import annotations

from catalog_published import Model, stated

# Meta's model card, table 'Params' column: '11B (10.6)', '90B (88.8)'
CARD = "https://huggingface.co/meta-llama/Llama-3.2-11B-Vision (model card, 'Params' column)"
_HUB = "https://huggingface.co/{id} (Hub 'Model size', from the checkpoint's safetensors)"
_NOTE = (
    "The count includes the vision tower (0.86B) and the projector ({proj}) of "
    "MllamaForConditionalGeneration; the text model alone, with its {cross} cross-attention layers, is "
    "{text}."
)
_NOTE_11B = _NOTE.format(proj="0.03B", cross=8, text="9.78B")
# the card's '88.8' is 0.2B above the checkpoint's 88.59B (Meta's own count); the Hub's figure matches
_NOTE_90B = _NOTE.format(proj="0.06B", cross=20, text="87.67B") + " The model card says 88.8B."


def _90b(model_id: str) -> Model:
    return Model(model_id, "Llama 3.2 Vision", "90B", stated("88.6B", _HUB.format(id=model_id), _NOTE_90B))


MODELS: tuple[Model, ...] = (
    Model("meta-llama/Llama-3.2-11B-Vision", "Llama 3.2 Vision", "11B", stated("10.6B", CARD, _NOTE_11B)),
    Model(
        "meta-llama/Llama-3.2-11B-Vision-Instruct",
        "Llama 3.2 Vision",
        "11B",
        stated("10.6B", CARD, _NOTE_11B),
    ),
    _90b("meta-llama/Llama-3.2-90B-Vision"),
    _90b("meta-llama/Llama-3.2-90B-Vision-Instruct"),
)
