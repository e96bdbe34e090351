"""Recording for the refactoring oracle (:mod:`regression`): wrap the core's outermost entry points while
pytest and the validation report run, and write each call's inputs as JSON."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))

# (module, function): the entry points whose calls are recorded; only the outermost call of a nest is kept
ENTRY_POINTS = (
    ("gpumem_gui.core.runtimes.inference", "estimate_inference"),
    ("gpumem_gui.core.training", "estimate_training"),
    ("gpumem_gui.core.fit", "fit_report"),
    ("gpumem_gui.core.fit.training", "fit_training"),
    ("gpumem_gui.core.replay.step", "simulate_step"),
)


def jsonable(x: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    from pydantic import BaseModel

    if isinstance(x, BaseModel):
        return {"__model__": type(x).__name__, "data": x.model_dump(mode="json")}
    if is_dataclass(x) and not isinstance(x, type):
        return {"__dataclass__": type(x).__name__, "data": asdict(x)}
    if isinstance(x, tuple | list):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, range):
        return {"__range__": [x.start, x.stop]}
    raise TypeError(f"cannot record {type(x).__name__}")


class Recorder:
    """Wraps the entry points in every loaded gpumem/test module; writes one JSON line per outermost call."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.depth = 0
        self.count = 0
        self.skipped = 0
        self.originals: dict[int, Callable[..., Any]] = {}
        self.wrapped: dict[int, Callable[..., Any]] = {}

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        rec = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer = rec.depth == 0
            rec.depth += 1
            try:
                result = fn(*args, **kwargs)
            finally:
                rec.depth -= 1
            if outer:
                try:
                    line = json.dumps({"fn": name, "args": jsonable(args), "kwargs": jsonable(kwargs)})
                except TypeError:
                    rec.skipped += 1
                else:
                    rec.out.write(line + "\n")
                    rec.count += 1
            return result

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    def install(self) -> None:
        import importlib

        for mod_name, fn_name in ENTRY_POINTS:
            mod = importlib.import_module(mod_name)
            fn = getattr(mod, fn_name)
            self.originals[id(fn)] = fn
            self.wrapped[id(fn)] = self._wrap(fn_name, fn)
        self.patch_loaded()

    def patch_loaded(self) -> None:
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or not mod_name.startswith(("gpumem_gui", "tests", "validate", "__main__")):
                continue
            for attr, val in list(vars(mod).items()):
                w = self.wrapped.get(id(val))
                if w is not None and self.originals.get(id(val)) is val:
                    setattr(mod, attr, w)


def record(out_path: Path, pytest_args: list[str], validate: bool) -> None:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out_path, "wt", encoding="utf-8") as out:
        rec = Recorder(out)
        rec.install()
        if pytest_args is not None:
            import os

            import pytest

            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

            class _Plugin:
                def pytest_collection_finish(self, session: Any) -> None:
                    rec.patch_loaded()  # test modules that imported the functions before install

            pytest.main(["-q", "-x", "-p", "no:cacheprovider", *pytest_args], plugins=[_Plugin()])
            print(f"pytest: {rec.count} calls recorded ({rec.skipped} not serialisable)", file=sys.stderr)
        if validate:
            sys.path.insert(0, str(REPO / "validation"))
            import validate as v

            rec.patch_loaded()
            before = rec.count
            v.collect(subset=False, peers=None)
            print(f"validate: {rec.count - before} calls recorded", file=sys.stderr)
