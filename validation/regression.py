"""The refactoring oracle: record every estimate the tests and ``make validate`` make, dump their results,
compare two dumps.

A refactor that must not move numbers is checked like this (README "Refactoring oracle"):

    python validation/regression.py record --out /tmp/reg/calls.jsonl.gz     # runs pytest + validate, ~3 min
    python validation/regression.py dump --calls /tmp/reg/calls.jsonl.gz --out before.json.gz
    ... change the code ...
    python validation/regression.py dump --calls /tmp/reg/calls.jsonl.gz --out after.json.gz
    python validation/regression.py compare before.json.gz after.json.gz

``record`` wraps the core's outermost entry points (inference and training estimates, inference and training
fit reports, the training step replay) while pytest and the validation report run, and writes each call's
inputs as JSON; ``dump`` adds a broad grid of its own (every reference config x inference and training modes
x a few shapes x parallel plans) and evaluates every call with the code as it is now. A result is kept as
its numbers (every byte count, phase, GPU and fact) and as a hash of its full JSON (labels and explanations
too), so ``compare`` says whether a change moved a number or only a text.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))


# ---- evaluation ----------------------------------------------------------------------------------------


def _load_spec(d: dict[str, Any]) -> Any:
    """A recorded spec; one recorded before specs had traits gets the readers' traits of its model_type."""
    from gpumem_gui.core import ModelSpec

    if "traits" not in d and "traits" in ModelSpec.model_fields:
        from gpumem_gui.core.readers.traits import traits_for

        d = {**d, "traits": traits_for(d["model_type"]).model_dump()}
    return ModelSpec.model_validate(d)


def _module(*names: str) -> Any:
    """The first module of ``names`` that imports: the tool runs on the code before and after a move."""
    import importlib

    for n in names:
        try:
            return importlib.import_module(n)
        except ImportError:
            continue
    raise ImportError(names[0])


def _load_config_file() -> Callable[[Path], Any]:
    return _module("gpumem_gui.core.readers.hf_config", "gpumem_gui.core.hf_config").load_config_file


def _revive(x: Any) -> Any:
    """Inverse of :func:`_jsonable` for the types the entry points take."""
    fit = _module("gpumem_gui.core.fit")
    training = _module("gpumem_gui.core.training")
    weights = _module("gpumem_gui.core.readers.weights", "gpumem_gui.core.weights")
    inference = _module("gpumem_gui.core.runtimes.inference", "gpumem_gui.core.inference")

    if isinstance(x, list):
        return tuple(_revive(v) for v in x)
    if not isinstance(x, dict):
        return x
    if "__model__" in x:
        kind, data = x["__model__"], x["data"]
        if kind == "ModelSpec":
            return _load_spec(data)
        cls = {
            "InferenceRun": inference.InferenceRun,
            "TrainingRun": training.TrainingRun,
            "GpuTarget": fit.GpuTarget,
            "WeightsInventory": weights.WeightsInventory,
        }[kind]
        return cls.model_validate(data)
    if "__dataclass__" in x:
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in x["data"].items()}
        return {"__dataclass__": x["__dataclass__"], **data}  # turned into the step's arguments by _step_call
    if "__range__" in x:
        return range(*x["__range__"])
    return {k: _revive(v) for k, v in x.items()}


# where each entry point lived before the core was split into subpackages
_OLD_HOMES = {
    "gpumem_gui.core.runtimes.inference": "gpumem_gui.core.inference",
    "gpumem_gui.core.fit.training": "gpumem_gui.core.train_fit",
    "gpumem_gui.core.replay.step": "gpumem_gui.core.train_step",
}


def _entry(name: str) -> Callable[..., Any]:
    from regression_record import ENTRY_POINTS

    mod = dict((f, m) for m, f in ENTRY_POINTS)[name]
    return getattr(_module(mod, _OLD_HOMES.get(mod, mod)), name)


def _numbers(obj: Any) -> Any:
    """The numbers of a result: every int/float/bool, with the keys that locate it; no free text."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    elif hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        obj = asdict(obj)
    return _strip(obj)


_TEXT_KEYS = {"explain", "label", "note", "description", "role", "where", "warnings", "source", "formula"}


def _strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in _TEXT_KEYS}
    if isinstance(x, list | tuple):
        return [_strip(v) for v in x]
    return x


def _full_hash(obj: Any) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    elif hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        obj = asdict(obj)
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _call_key(call: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(call, sort_keys=True).encode()).hexdigest()[:20]


def recorded_calls(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _step_call(
    fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    """A training step replay recorded as ``simulate_step(spec, StepConfig, optimizer, **sharding kwargs)``,
    as the code of its time or of today takes it (``ReplayConfig``, ``StepOptions``, ``ShardingHooks``)."""
    spec, cfg, optimizer = args[0], dict(args[1]), args[2]
    kind = cfg.pop("__dataclass__")
    try:
        step_mod = _module("gpumem_gui.core.replay.step")
        from gpumem_gui.core.replay.config import ReplayConfig
        from gpumem_gui.core.training.sharding import ShardingHooks
    except ImportError:  # the code before the one forward: StepConfig and keyword arguments
        cls = _module("gpumem_gui.core.train_model").StepConfig
        assert kind == "StepConfig"
        return fn, [spec, cls(**cfg), optimizer], kwargs
    hooks = ShardingHooks(
        param_shard=cfg.pop("param_shard", 1),
        grad_shard=kwargs.get("grad_shard", 1),
        gather=cfg.pop("gather", "none"),
        params_offloaded=cfg.pop("params_offloaded", False),
        grads_dropped=kwargs.get("offload_states", False),
        main_grad=kwargs.get("main_grad", False),
    )
    if "seq" in cfg:
        cfg["q"] = cfg.pop("seq")
    opts = step_mod.StepOptions(
        grad_accum=kwargs.get("grad_accum", 1),
        first_step=kwargs.get("first_step", False),
        state_shard=kwargs.get("state_shard", 1),
        offload_states=kwargs.get("offload_states", False),
        fused_step=kwargs.get("main_grad", False),
        master_bytes_per_param=kwargs.get("master_bytes_per_param", 0),
    )
    return fn, [spec, ReplayConfig(**cfg), optimizer, opts, hooks], {}


def evaluate(call: dict[str, Any]) -> dict[str, Any]:
    fn = _entry(call["fn"])
    args = [_revive(a) for a in call["args"]]
    if call["fn"] == "simulate_step":
        fn, args, kwargs = _step_call(fn, args, {k: _revive(v) for k, v in call["kwargs"].items()})
        return _result(fn, args, kwargs)
    if "config" in call:  # a grid call: the spec is read from its config file by the readers of today
        args.insert(0, _load_config_file()(REPO / call["config"]))
    kwargs = {k: _revive(v) for k, v in call["kwargs"].items()}
    return _result(fn, args, kwargs)


def _result(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    from gpumem_gui.core import GpumemError

    try:
        res = fn(*args, **kwargs)
    except GpumemError as e:
        return {"error": str(e)}
    return {"numbers": _numbers(res), "hash": _full_hash(res)}


def dump(calls_path: Path | None, out: Path, grid: bool) -> None:
    calls: dict[str, dict[str, Any]] = {}
    if calls_path is not None:
        for c in recorded_calls(calls_path):
            calls.setdefault(_call_key(c), c)
    if grid:
        from regression_grid import grid_calls

        make_run = _module("gpumem_gui.core.runtimes.inference", "gpumem_gui.core.inference").make_run
        for c in grid_calls(_load_config_file(), make_run):
            calls.setdefault(_call_key(c), c)
    import gpumem_gui

    print(f"evaluating with {Path(gpumem_gui.__file__).parent}", file=sys.stderr)
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    for i, (key, c) in enumerate(sorted(calls.items())):
        results[key] = {"fn": c["fn"], **evaluate(c)}
        if i % 500 == 499:
            print(f"{i + 1}/{len(calls)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump({"calls": calls, "results": results}, f, sort_keys=True)
    kinds = Counter(r["fn"] for r in results.values())
    print(f"{len(results)} results ({dict(kinds)}) in {time.perf_counter() - t0:.0f} s -> {out}")


def _run_defaults() -> dict[str, dict[str, Any]]:
    """Today's default of every field of the run models and the GPU target (the fields that have one), as a
    dump stores them (JSON): a field added since a dump was made keys the same call as before."""
    from pydantic import TypeAdapter
    from pydantic_core import PydanticUndefined

    from gpumem_gui.core import GpuTarget, InferenceRun, TrainingRun

    out = {m.__name__: m().model_dump(mode="json") for m in (InferenceRun, TrainingRun)}
    out["GpuTarget"] = {
        k: TypeAdapter(Any).dump_python(f.default, mode="json")
        for k, f in GpuTarget.model_fields.items()
        if f.default is not PydanticUndefined
    }
    return out


# Run fields whose default changed, with the defaults they had: a call a dump made at a past default keys the
# same call as one at today's (its numbers then move, deliberately, and CHANGELOG.md says why).
PAST_DEFAULTS: dict[str, dict[str, tuple[Any, ...]]] = {
    # issue 31: the CUDA context by GPU generation (core/results/nontorch.py) instead of a flat 500 MiB
    # issue 28: Ollama's num_batch auto (Ollama v0.33 picks it; v0.12.10 resolves it to 512 as before)
    # Ollama's release: 0.30+ (llama-server, llama.cpp's --fit) since its MoE fit over several GPUs; a call
    # recorded at 0.12.10 keeps it (its run names it), one keyed without it now means 0.30+
    "InferenceRun": {"cuda_context_mib": (500,), "num_batch": (512,), "ollama_version": ("0.12.10",)},
    "TrainingRun": {"cuda_context_mib": (500,)},
}


def _plain_key(call: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> str:
    """A call's key with every run field at today's default (or a past one, :data:`PAST_DEFAULTS`) left out: a
    run field added since a dump was made (its default taken) keys the same call as before."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict) and x.get("__model__") in defaults and isinstance(x.get("data"), dict):
            d, past = defaults[x["__model__"]], PAST_DEFAULTS.get(x["__model__"], {})
            return {
                **x,
                "data": {
                    k: v for k, v in x["data"].items() if d.get(k, ...) != v and v not in past.get(k, ())
                },
            }
        return x

    return _call_key({**call, "args": [plain(x) for x in call.get("args", [])]})


def _rekey(dump: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = {k: _plain_key(c, defaults) for k, c in dump["calls"].items()}
    return {
        "calls": {keys[k]: c for k, c in dump["calls"].items()},
        "results": {keys[k]: r for k, r in dump["results"].items() if k in keys},
    }


def compare(a_path: Path, b_path: Path, show: int) -> int:
    with gzip.open(a_path, "rt", encoding="utf-8") as f:
        a = json.load(f)
    with gzip.open(b_path, "rt", encoding="utf-8") as f:
        b = json.load(f)
    defaults = _run_defaults()  # match calls across a new run field's default (its key changes)
    a, b = _rekey(a, defaults), _rekey(b, defaults)
    ra, rb = a["results"], b["results"]
    common = sorted(set(ra) & set(rb))
    moved = [
        k
        for k in common
        if ra[k].get("numbers") != rb[k].get("numbers")
        or ("error" in ra[k] and ra[k].get("error") != rb[k].get("error"))
    ]
    text = [k for k in common if k not in moved and ra[k].get("hash") != rb[k].get("hash")]
    print(
        f"{len(common)} common results: {len(moved)} with moved numbers, {len(text)} with only text changes"
    )
    print(f"only in {a_path.name}: {len(set(ra) - set(rb))}; only in {b_path.name}: {len(set(rb) - set(ra))}")
    by_fn = Counter(ra[k]["fn"] for k in moved)
    if by_fn:
        print("moved, by entry point:", dict(by_fn))
    for k in moved[:show]:
        call = a["calls"][k]
        print(f"--- {k} {call['fn']}")
        _diff(ra[k], rb[k], "")
    return 1 if moved else 0


def _diff(x: Any, y: Any, path: str, limit: list[int] | None = None) -> None:
    limit = limit if limit is not None else [12]
    if limit[0] <= 0:
        return
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            _diff(x.get(k), y.get(k), f"{path}.{k}", limit)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            _diff(u, v, f"{path}[{i}]", limit)
    elif x != y:
        limit[0] -= 1
        print(f"  {path}: {x!r} -> {y!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run pytest and the validation report, recording every estimate call")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--no-validate", action="store_true")
    r.add_argument("pytest_args", nargs="*")
    d = sub.add_parser("dump", help="evaluate recorded calls (+ the broad grid) with the code as it is now")
    d.add_argument("--calls", type=Path)
    d.add_argument("--no-grid", action="store_true")
    d.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="which results moved between two dumps")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--show", type=int, default=20)
    args = p.parse_args(argv)
    if args.cmd == "record":
        from regression_record import record

        record(args.out, args.pytest_args, not args.no_validate)
        return 0
    if args.cmd == "dump":
        dump(args.calls, args.out, not args.no_grid)
        return 0
    return compare(args.a, args.b, args.show)


if __name__ == "__main__":
    raise SystemExit(main())
