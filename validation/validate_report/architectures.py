"""Section (f), per model type: every architecture the readers describe, against what transformers itself
builds and allocates. Parameters and KV bytes per token come from the static reference measurements
(``groundtruth.json`` and ``tests/reference/extra/groundtruth_extra.json``: the real model built on the meta
device, the cache of a real forward); peaks from the traced points (``tests/reference/trace``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpumem_gui.core.readers.hf_config import SUPPORTED_MODEL_TYPES, load_config_file
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_transformers
from gpumem_gui.core.spec.params import count_params

from .common import EXTRA, config_path, reference_dir

Errors = list[tuple[str, float]]


@dataclass
class _Type:
    configs: set[str] = field(default_factory=set)
    params_exact: int = 0
    params_checked: int = 0
    kv_exact: int = 0
    kv_checked: int = 0
    infer: list[float] = field(default_factory=list)
    train: list[float] = field(default_factory=list)


def _static_entries() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in (reference_dir() / "groundtruth.json", EXTRA / "groundtruth_extra.json"):
        if path.is_file():
            out.update(
                {k: v for k, v in json.loads(path.read_text())["static"].items() if "total_params" in v}
            )
    return out


def _model_type(name: str, cache: dict[str, str]) -> str:
    if name not in cache:
        cache[name] = load_config_file(config_path(name)).model_type
    return cache[name]


def _kv_exact(name: str, st: dict) -> bool:
    """Our KV bytes per token and per-layer cache bytes at every measured length equal the reference's (the
    comparison of tests/test_params_groundtruth.py)."""
    spec = load_config_file(config_path(name))
    if sum(kv_bytes_per_token_per_layer(spec)) != st["kv_cache_bytes_per_token_bf16"]:
        return False
    return all(
        list(kv_cache_bytes_transformers(spec, int(tokens))) == m["per_layer_bytes"]
        for tokens, m in st.get("kv_cache_measured", {}).items()
    )


def _other_traces(types: dict[str, _Type]) -> None:
    """Encoders (``tests/reference/encoders``) and encoder-decoders (``tests/reference/seq2seq``): their own
    traced points (each head; generation), compared as ``tests/test_encoders.py`` / ``test_seq2seq.py`` do."""
    from gpumem_gui.core import estimate_inference, make_run, make_training_run
    from gpumem_gui.core.spec.encoder import with_head
    from gpumem_gui.core.training import simulate_rank

    for sub in ("encoders", "seq2seq"):
        d = EXTRA.parent / sub
        if not (d / "trace.json").is_file():
            continue
        for p in json.loads((d / "trace.json").read_text())["points"]:
            if "error" in p:
                continue
            r, spec = dict(p["run"]), load_config_file(d / "configs" / f"{p['model']}.json")
            if "task" in r:
                spec = with_head(spec, r.pop("task"))
            t = types[spec.model_type]
            t.configs.add(p["model"])
            r["attn"] = p.get("attn_implementation_used") or r.get("attn", "sdpa")
            if p["mode"] == "train":
                res, _, _ = simulate_rank(spec, make_training_run(**r), cpu_dropout=True)
                meas = max(m["Total"] for m in p["phases"].values())
                t.train.append((max(ph.total for ph in res.phases.values()) - meas) / meas)
                continue
            if "compute_dtype" in r:
                r["weights"] = r["compute_dtype"]
            est = estimate_inference(spec, make_run(**r))
            for ph, m in p["phases"].items():
                if ph != "load":
                    t.infer.append((est.phases[ph].peak_bytes - m["Total"]) / m["Total"])


def collect(infer: Errors, train: Errors) -> dict[str, _Type]:
    types: dict[str, _Type] = defaultdict(_Type)
    names: dict[str, str] = {}
    for name, st in _static_entries().items():
        try:
            mt = _model_type(name, names)
        except FileNotFoundError:
            continue
        t = types[mt]
        t.configs.add(name)
        t.params_checked += 1
        t.params_exact += count_params(load_config_file(config_path(name))).total == st["total_params"]
        if isinstance(st.get("kv_cache_bytes_per_token_bf16"), int):
            t.kv_checked += 1
            t.kv_exact += _kv_exact(name, st)
    for errs, attr in ((infer, "infer"), (train, "train")):
        for setup, err in errs:
            name = setup.split(" · ", 1)[0]
            mt = _model_type(name, names)
            types[mt].configs.add(name)
            getattr(types[mt], attr).append(err)
    _other_traces(types)
    return types


def _worst(errs: list[float]) -> str:
    if not errs:
        return "–"
    w = max(errs, key=abs)
    return f"{len(errs)} · {w * 100:+.2f} %"


def render_architectures(add: Callable[[str], None], infer: Errors, train: Errors) -> None:
    """The table, from the traced errors section (f) computed (``(setup, relative error)`` pairs)."""
    types = collect(infer, train)
    add("### Per model type")
    add("")
    add(
        "Parameters: our count equal to the real model's (built by transformers on the meta device) for how "
        "many of the type's reference configs. KV: bytes per token equal to the cache of a real forward. "
        "Peaks: traced points and the worst error of each kind. A type with no traced point is described "
        "by the readers but measured only statically."
    )
    add("")
    add(
        "| model type | configs | parameters exact | KV per token exact | inference peaks · worst | training "
        "peaks · worst |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    for mt in sorted(SUPPORTED_MODEL_TYPES):
        t = types.get(mt)
        if t is None:
            add(f"| {mt} | 0 | – | – | – | – |")
            continue
        params = f"{t.params_exact}/{t.params_checked}" if t.params_checked else "–"
        kv = f"{t.kv_exact}/{t.kv_checked}" if t.kv_checked else "–"
        add(f"| {mt} | {len(t.configs)} | {params} | {kv} | {_worst(t.infer)} | {_worst(t.train)} |")
    add("")
    add(
        "Encoders (bert, roberta, deberta-v2, modernbert) and T5-family encoder-decoders are counted per "
        "task head against `AutoModelFor...` built on the meta device by `tests/test_encoders.py` and "
        "`tests/test_seq2seq.py` (`tests/reference/encoders/params.json`, `tests/reference/seq2seq/`), not "
        "by the causal-LM reference above; they keep no KV cache of the decoder kind (T5's self- and "
        "cross-attention caches are compared in its traced points)."
    )
    add("")
