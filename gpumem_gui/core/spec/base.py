"""The building blocks every core model shares: the frozen base class and the sanity bounds of sizes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Sanity bounds, far above any published model (the largest have ~100-200 layers, hidden sizes of ~30k,
# vocabularies of ~260k and ~1M-token contexts); they keep absurd inputs from running for hours.
MAX_LAYERS = 4096
MAX_SIZE = 1 << 31

PositiveInt = Annotated[int, Field(gt=0, le=MAX_SIZE)]
NonNegInt = Annotated[int, Field(ge=0, le=MAX_SIZE)]


# Hashes of the models hashed last, by identity (the model kept, so its id is not reused while it is here).
# Pydantic hashes a frozen model by hashing every field, sub-models included, each time: a ModelSpec costs
# 10-35 us, and an estimate's caches (tapes, kinds, the step memo) hash the spec and the run several times.
_HASHES: OrderedDict[int, tuple[BaseModel, int]] = OrderedDict()
_HASHES_KEPT = 1024  # definition


class Frozen(BaseModel):
    """Base of every core model: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __hash__(self) -> int:
        """Pydantic's hash of a frozen model (its fields' values in order), computed once per object: the
        fields never change, so neither does the hash."""
        hit = _HASHES.get(id(self))
        if hit is not None and hit[0] is self:
            return hit[1]
        h = hash(tuple(self.__dict__[f] for f in type(self).model_fields))
        _HASHES[id(self)] = (self, h)
        if len(_HASHES) > _HASHES_KEPT:
            _HASHES.popitem(last=False)
        return h
