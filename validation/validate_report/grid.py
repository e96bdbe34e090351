"""Sections (a) and (d): every point of the PyTorch-measured grids, our estimate against the measured peak.

The grids are the reference data's ``groundtruth.json`` and ``tests/reference/extra/grid_{infer,train}.json``;
which modes are compared, their labels and the ``--subset`` points are in ``validation/data/grid.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gpumem_gui.core.readers.hf_config import load_config_file
from gpumem_gui.core.reference_points import inference_run_for_point, training_run_for_point
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import estimate_inference
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import estimate_training, simulate_rank

from . import data
from .common import EXTRA, REASON_THRESHOLD, GiB, MiB, Row, config_path, reference_dir, replace_row, short

TRAIN_PHASES = ("forward", "backward", "optimizer")
K_GRID_PEAK = "peak live tensors (MemTracker = max_memory_allocated)"
K_TRAIN_PEAK = "training peak (MemTracker = max_memory_allocated)"
K_TRAIN_PHASE = "training phase peaks (forward / backward / optimizer)"


def _points(files: tuple[tuple[str, Path], ...], keep_mode: Callable[[str], bool]) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for label, path in files:
        for p in json.loads(path.read_text())["grid"]:
            if keep_mode(p["mode"]) and "peak_bytes" in p:
                out.append((label, p))
    return out


def point_key(p: dict) -> tuple:
    """(model, mode, batch, seq, attention): a grid point's identity, and the start of its rows' sort key."""
    return (p["model"], p["mode"], p["batch"], p["seq"], p["attn_implementation"])


def _spec(specs: dict[str, ModelSpec], model: str) -> ModelSpec:
    spec = specs.get(model) or load_config_file(config_path(model))
    specs[model] = spec
    return spec


# ---- (a) inference ----------------------------------------------------------------------------------------


def grid_points(subset: bool = False) -> list[tuple[str, dict]]:
    """Inference points of both grids as (file label, point); ``subset``: a few small, fast ones."""
    modes = data.grid().inference_modes
    out = _points(
        (
            ("groundtruth.json", reference_dir() / "groundtruth.json"),
            ("extra/grid_infer.json", EXTRA / "grid_infer.json"),
        ),
        lambda mode: mode in modes,
    )
    if subset:
        keep = {(k.model, k.batch, k.seq, k.attn) for k in data.grid().subset.inference}
        out = [(f, p) for f, p in out if (p["model"], p["batch"], p["seq"], p["attn_implementation"]) in keep]
    return out


def grid_setup(p: dict) -> str:
    mode = data.grid().inference_modes[p["mode"]]
    attn = p.get("attn_implementation_used") or p["attn_implementation"]
    return f"{short(p['model'])} · prefill, {mode} · b{p['batch']} s{p['seq']} · {attn}"


def _grid_reason(p: dict, est: Estimate) -> str:
    """Where the gap is, from the measured breakdown and our components."""
    bd = p.get("peak_breakdown_bytes", {})
    w_meas = bd.get("Parameter", 0) + bd.get("Buffer", 0)
    w_ours = est.component("weights").bytes  # type: ignore[union-attr]
    act_meas = bd.get("Activation", 0) + bd.get("Other", 0)
    act_ours = est.peak_bytes - w_ours
    return (
        f"weights ours {w_ours / GiB:.3f} vs measured {w_meas / GiB:.3f} GiB; activations at the peak ours "
        f"{act_ours / GiB:.3f} vs measured {act_meas / GiB:.3f} GiB ({est.phases[est.peak_phase].note})"
    )


def grid_rows(subset: bool = False) -> list[Row]:
    rows = []
    specs: dict[str, ModelSpec] = {}
    for label, p in grid_points(subset):
        est = estimate_inference(_spec(specs, p["model"]), inference_run_for_point(p))
        row = Row(
            table="grid",
            kind=K_GRID_PEAK,
            sort_key=point_key(p),
            setup=grid_setup(p),
            measured=p["peak_bytes"],
            ours=est.peak_bytes,
            source=label,
            kv_measured=p.get("kv_cache_bytes"),
            kv_ours=est.kv_cache_bytes,
        )
        if abs(row.err) > REASON_THRESHOLD:
            row = replace_row(row, reason=_grid_reason(p, est))
        rows.append(row)
    return sorted(rows, key=lambda r: r.sort_key)


# ---- (d) training -----------------------------------------------------------------------------------------


def train_grid_points(subset: bool = False) -> list[tuple[str, dict]]:
    """Training points of both grids (``train_*`` and ``lora_*`` modes); ``subset``: two small ones."""
    out = _points(
        (
            ("groundtruth.json", reference_dir() / "groundtruth.json"),
            ("extra/grid_train.json", EXTRA / "grid_train.json"),
        ),
        lambda mode: mode.startswith(("train", "lora")),
    )
    if subset:
        keep = {(k.model, k.mode, k.batch, k.seq, k.attn) for k in data.grid().subset.training}
        out = [(f, p) for f, p in out if point_key(p) in keep]
    return out


def train_grid_setup(p: dict) -> str:
    mode = p["mode"]
    what = data.grid().training_modes.get(mode, mode)
    if "lora_rank" in p:
        t = p["lora_targets"]
        what += f" r{p['lora_rank']} {t if t == 'all-linear' else '+'.join(t)}"
    if p.get("config_override"):
        what += ", dropout off"
    attn = p.get("attn_implementation_used") or p["attn_implementation"]
    return f"{short(p['model'])} · {what} · b{p['batch']} s{p['seq']} · {attn}"


def _train_estimate(spec: ModelSpec, p: dict) -> tuple[int, dict[str, int], str, Estimate | None]:
    """(peak, phase peaks, peak phase, estimate) for a measured point. A point measured with dropout on
    the CPU replays CPU dropout (a noise tensor of the input's dtype), not CUDA's bool mask."""
    run = training_run_for_point(p)
    if p.get("dropout_kernel") == "cpu":
        res, _, _ = simulate_rank(spec, run, cpu_dropout=True)
        phases = {ph: res.phases[ph].total for ph in TRAIN_PHASES}
        top = max(phases, key=lambda k: phases[k])
        return phases[top], phases, top, None
    est = estimate_training(spec, run)
    phases = {ph: est.phases[ph].peak_bytes for ph in TRAIN_PHASES}
    return est.peak_bytes, phases, est.peak_phase, est


def _train_grid_reason(p: dict, phases: dict[str, int], top: str) -> str:
    meas = p["phase_peaks_bytes"]
    worst = max(TRAIN_PHASES, key=lambda ph: abs(phases[ph] - meas[ph]["Total"]) / meas[ph]["Total"])
    bd = meas[worst]
    parts = ", ".join(f"{k} {v / GiB:.3f}" for k, v in bd.items() if k != "Total" and v > MiB)
    return (
        f"{worst} phase: ours {phases[worst] / GiB:.3f} GiB vs measured {bd['Total'] / GiB:.3f} GiB ({parts} "
        f"GiB); our peak phase is {top}"
    )


def _train_rows(label: str, p: dict, spec: ModelSpec) -> tuple[Row, list[Row]]:
    """The peak row of one training point and its three phase rows."""
    peak, phases, top, _ = _train_estimate(spec, p)
    key = (
        *point_key(p),
        p.get("lora_rank", 0),
        json.dumps(p.get("lora_targets")),
        bool(p.get("config_override")),
    )
    setup = train_grid_setup(p)
    ph_rows = [
        Row(
            table="train-phase",
            kind=K_TRAIN_PHASE,
            sort_key=(*key, i),
            setup=f"{setup} · {ph}",
            measured=p["phase_peaks_bytes"][ph]["Total"],
            ours=phases[ph],
            source=label,
        )
        for i, ph in enumerate(TRAIN_PHASES)
    ]
    row = Row(
        table="train",
        kind=K_TRAIN_PEAK,
        sort_key=key,
        setup=setup,
        measured=p["peak_bytes"],
        ours=peak,
        source=label,
        phases=tuple((r.measured, r.ours) for r in ph_rows),
    )
    if abs(row.err) > REASON_THRESHOLD or any(abs(r.err) > REASON_THRESHOLD for r in ph_rows):
        row = replace_row(row, reason=_train_grid_reason(p, phases, top))
    return row, ph_rows


def train_grid_rows(subset: bool = False) -> tuple[list[Row], list[Row]]:
    """(peak rows, phase rows) for the training points of both grids."""
    peaks: list[Row] = []
    phases_out: list[Row] = []
    specs: dict[str, ModelSpec] = {}
    for label, p in train_grid_points(subset):
        row, ph_rows = _train_rows(label, p, _spec(specs, p["model"]))
        peaks.append(row)
        phases_out.extend(ph_rows)
    return sorted(peaks, key=lambda r: r.sort_key), sorted(phases_out, key=lambda r: r.sort_key)
