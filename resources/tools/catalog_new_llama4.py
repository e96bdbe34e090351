"""Catalog entries of the model types issue 14 adds, group llama4: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count."""

from __future__ import annotations

from catalog_published import Model, label, stated

# Meta's model cards list 'Activated Params' and 'Total Params' per model (17B activated for both)
SCOUT_CARD = (
    "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct (model card, 'Total Params' column)"
)
MAVERICK_CARD = (
    "https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct (model card, 'Total Params' column)"
)
COUNT_NOTE = (
    "The total includes the vision tower and projector of Llama4ForConditionalGeneration (0.87B); the text "
    "model alone is {text}."
)

MODELS: tuple[Model, ...] = (
    Model(
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "Llama 4",
        "17B-16E",
        stated("109B", SCOUT_CARD, COUNT_NOTE.format(text="107.77B")),
    ),
    Model(
        "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        "Llama 4",
        "17B-128E",
        # '400B' is a round figure: the exact count is 401.58B, 0.4 % above, beyond one unit of its last digit
        label("400B", MAVERICK_CARD, COUNT_NOTE.format(text="400.71B")),
    ),
)
