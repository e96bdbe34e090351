"""The building blocks every core model shares: the frozen base class and the sanity bounds of sizes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Sanity bounds, far above any published model (the largest have ~100-200 layers, hidden sizes of ~30k,
# vocabularies of ~260k and ~1M-token contexts); they keep absurd inputs from running for hours.
MAX_LAYERS = 4096
MAX_SIZE = 1 << 31

PositiveInt = Annotated[int, Field(gt=0, le=MAX_SIZE)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_SIZE)]


class Frozen(BaseModel):
    """Base of every core model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
