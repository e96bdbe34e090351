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

    # the object's hash, kept on the object once computed (a slot: no field, so neither equality nor dumps
    # see it, and a copy made by ``model_copy`` (new field values) or pickling starts without it)
    __slots__ = ("_frozen_hash",)
    model_config = ConfigDict(frozen=True, extra="forbid")

    def __hash__(self) -> int:
        """Pydantic's hash of a frozen model (its fields' values in order), computed once per object: the
        fields never change, so neither does the hash. Pydantic hashes every field, sub-models included, on
        each call: a ModelSpec costs 10-35 us, and an estimate's caches (tapes, kinds, the step memo) hash
        the spec and the run several times."""
        try:
            return _KEPT_HASH.__get__(self)  # type: ignore[no-any-return]
        except AttributeError:  # from the slot itself, not pydantic's __getattr__ (2.9 -> 1.2 us)
            h = hash(tuple(map(self.__dict__.__getitem__, type(self).model_fields)))
            _KEPT_HASH.__set__(self, h)
            return h


_KEPT_HASH = Frozen.__dict__["_frozen_hash"]  # the slot's descriptor
