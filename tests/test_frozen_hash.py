"""Frozen models hash once per object (core/spec/base.py), and equal objects hash equal."""

from __future__ import annotations

import copy
import pickle

from pydantic import ConfigDict

from gpumem_gui.core.spec.base import Frozen
from gpumem_gui.core.training import make_training_run


class Counted:
    """A field value that counts how often it is hashed."""

    calls = 0

    def __init__(self, v: int) -> None:
        self.v = v

    def __hash__(self) -> int:
        Counted.calls += 1
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counted) and other.v == self.v


class Model(Frozen):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    c: Counted
    n: int = 0


def test_hash_computed_once_per_object_however_many_are_hashed_between() -> None:
    m = Model(c=Counted(1))
    Counted.calls = 0
    h = hash(m)
    assert Counted.calls == 1
    # many other models hashed in between (an earlier table of the last 1,024 forgot the first)
    others = [Model(c=Counted(k), n=k) for k in range(3000)]
    for o in others:
        hash(o)
    Counted.calls = 0
    assert hash(m) == h
    assert hash(m) == h
    assert Counted.calls == 0


def test_equal_objects_hash_equal_and_copies_rehash() -> None:
    a, b = Model(c=Counted(2), n=3), Model(c=Counted(2), n=3)
    assert a == b and hash(a) == hash(b)
    moved = a.model_copy(update={"n": 4})  # a copy with a new value must not keep the old hash
    assert moved != a and hash(moved) == hash(Model(c=Counted(2), n=4))
    assert hash(a.model_copy()) == hash(a)
    for clone in (copy.deepcopy(a), copy.copy(a)):
        assert clone == a and hash(clone) == hash(a)
    # the kept hash is no field: equality, dumps and pickles do not see it
    assert a.model_dump() == {"c": Counted(2), "n": 3}
    assert "_frozen_hash" not in a.__dict__


def test_real_models_hash_as_their_fields() -> None:
    run = make_training_run(method="lora", seq=2048, batch=2)
    same = make_training_run(method="lora", seq=2048, batch=2)
    assert hash(run) == hash(same)
    other = run.model_copy(update={"seq": 4096})
    hash(run)
    assert hash(other) != hash(run)
    assert hash(other) == hash(make_training_run(method="lora", seq=4096, batch=2))
    back = pickle.loads(pickle.dumps(run))
    assert back == run and hash(back) == hash(run)
