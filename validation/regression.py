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

# (module, function): the entry points whose calls are recorded; only the outermost call of a nest is kept
ENTRY_POINTS = (
    ("gpumem_gui.core.runtimes.inference", "estimate_inference"),
    ("gpumem_gui.core.training", "estimate_training"),
    ("gpumem_gui.core.fit", "fit_report"),
    ("gpumem_gui.core.fit.training", "fit_training"),
    ("gpumem_gui.core.replay.step", "simulate_step"),
)


# ---- recording -----------------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    from pydantic import BaseModel

    if isinstance(x, BaseModel):
        return {"__model__": type(x).__name__, "data": x.model_dump(mode="json")}
    if is_dataclass(x) and not isinstance(x, type):
        return {"__dataclass__": type(x).__name__, "data": asdict(x)}
    if isinstance(x, tuple | list):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
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
                    line = json.dumps({"fn": name, "args": _jsonable(args), "kwargs": _jsonable(kwargs)})
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
        from gpumem_gui.core.replay.model import ReplayConfig
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
        for c in grid_calls():
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


def compare(a_path: Path, b_path: Path, show: int) -> int:
    with gzip.open(a_path, "rt", encoding="utf-8") as f:
        a = json.load(f)
    with gzip.open(b_path, "rt", encoding="utf-8") as f:
        b = json.load(f)
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


# ---- the broad grid ------------------------------------------------------------------------------------


def _config_files() -> list[Path]:
    dirs = [REPO / "tests" / "reference" / "configs", REPO / "tests" / "reference" / "extra" / "configs"]
    return sorted(p for d in dirs for p in d.glob("*.json"))


def grid_calls() -> Iterator[dict[str, Any]]:
    """Every reference config x inference and training modes x a few shapes and plans."""
    from gpumem_gui.core import GpumemError
    from gpumem_gui.core.fit import GpuTarget
    from gpumem_gui.core.training import make_training_run

    load_config_file = _load_config_file()
    make_run = _module("gpumem_gui.core.runtimes.inference", "gpumem_gui.core.inference").make_run

    def call(fn: str, spec: Any, *args: Any) -> dict[str, Any]:
        rel = str(path.relative_to(REPO))
        return json.loads(json.dumps({"fn": fn, "config": rel, "args": _jsonable(args), "kwargs": {}}))

    h100 = GpuTarget(name="H100-SXM-80GB", capacity_bytes=80 * 2**30, count=8)
    for path in _config_files():
        try:
            spec = load_config_file(path)
        except GpumemError:
            continue
        big = spec.num_layers * spec.hidden_size > 80 * 8192 or spec.moe is not None
        infer = []
        for attn in ("sdpa", "eager", "flash"):
            for batch, seq, new in ((1, 512, 0), (2, 1024, 64), (1, 8192, 1), (4, 300, 1000)):
                infer.append(dict(batch=batch, seq=seq, new_tokens=new, attn=attn))
        infer += [
            dict(batch=1, seq=4096, logits="all"),
            dict(batch=1, seq=4096, new_tokens=128, tp=2),
            dict(batch=1, seq=4096, new_tokens=128, pp=2),
            dict(batch=2, seq=4096, new_tokens=128, compute_dtype="fp32"),
            dict(batch=2, seq=4096, new_tokens=128, weights="nf4"),
            dict(batch=2, seq=4096, new_tokens=128, kv_dtype="fp8"),
            dict(batch=8, seq=2048, new_tokens=256, engine="vllm"),
            dict(batch=8, seq=2048, new_tokens=256, engine="vllm", tp=2, max_model_len=8192),
            dict(batch=1, seq=8192, new_tokens=256, engine="llama.cpp", weights="gguf-Q4_K_M"),
            dict(batch=1, seq=8192, new_tokens=256, engine="llama.cpp", weights="gguf-Q8_0", n_gpu_layers=3),
        ]
        for kw in infer:
            try:
                run = make_run(**kw)
            except GpumemError:
                continue
            yield call("estimate_inference", spec, run)
            if kw.get("engine") == "vllm":
                yield call("estimate_inference", spec, run, 80 * 2**30)
        yield call("fit_report", spec, make_run(batch=4, seq=4096, new_tokens=256), h100)
        train = [
            dict(),
            dict(grad_ckpt=True, batch=2),
            dict(precision="bf16", attn="eager", seq=512),
            dict(precision="fp32", seq=512),
            dict(precision="amp-fp16", optimizer="adamw-fused", grad_accum=2),
            dict(precision="megatron-bf16", tp=2, dp=2),
            dict(method="lora", lora_rank=8),
            dict(method="lora", precision="bf16", grad_ckpt=True, lora_targets="q_proj,v_proj"),
            dict(method="qlora", qlora_base="nf4-dq", grad_ckpt=True, optimizer="paged-adamw-8bit"),
            dict(zero=3, dp=8, grad_ckpt=True),
            dict(zero=2, dp=4, offload="optimizer"),
            dict(fsdp="full_shard", dp=4),
            dict(fsdp="shard_grad_op", dp=2, optimizer="adafactor"),
            dict(pp=2, grad_accum=4, optimizer="lion"),
            dict(cp=2, seq=8192, grad_ckpt=True, optimizer="sgd-momentum"),
            dict(first_step=True, optimizer="adamw-8bit", frozen_layers=1),
        ]
        if spec.moe is not None:
            train.append(dict(ep=2, dp=2))
        for kw in train:
            kw = {"seq": 1024, **kw}
            if big:
                kw["seq"] = min(kw["seq"], 512)
            try:
                run = make_training_run(**kw)
            except GpumemError:
                continue
            yield call("estimate_training", spec, run)
        yield call("fit_training", spec, make_training_run(method="lora", seq=2048, grad_ckpt=True), h100)


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
        record(args.out, args.pytest_args, not args.no_validate)
        return 0
    if args.cmd == "dump":
        dump(args.calls, args.out, not args.no_grid)
        return 0
    return compare(args.a, args.b, args.show)


if __name__ == "__main__":
    raise SystemExit(main())
