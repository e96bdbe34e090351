"""Section (d), published: the fine-tuning points we reproduce (full fine-tune, LoRA, QLoRA; torchtune,
torchtitan, fsdp_qlora, HF docs), two fits/OOM bounds and one largest-context bound.

Which model spec and training run stand for each point, and which of our numbers for each published figure,
is in ``validation/data/published_training.json`` (:data:`PUBLISHED_TRAINING`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from gpumem_gui.core.monotone import gallop
from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training import TrainingRun, estimate_training, make_training_run

from . import data
from .common import REASON_THRESHOLD, GiB, Row, config_path, replace_row, spec_for
from .ours import TRAINING_FIELDS, TCtx, explain, ours_train

PUBLISHED_TRAINING: tuple[data.TMapping, ...] = data.published_training().mappings
TRAIN_OURS: dict[str, str] = data.published_training().ours

# our numbers for these published figures come from the caching allocator model (core/results/reported.py)
ALLOCATOR_KEYS = ("reserved", "total")

Line = tuple[str, str, str, str, str]  # a mapping line (id, model, run, numbers, assumptions) or a verdict


def train_spec(model: str) -> ModelSpec:
    """A catalog model, or ``gpt2-large`` (gpt2's config with gpt2-large's dimensions)."""
    if model == "gpt2-large":
        cfg = json.loads(config_path("openai-community__gpt2").read_text())
        cfg.update(n_embd=1280, n_layer=36, n_head=20)
        return spec_from_config(cfg, name="openai-community/gpt2-large")
    return spec_for(model)


def max_seq(spec: ModelSpec, run: TrainingRun, capacity: int) -> int | None:
    """The largest sequence whose total fits ``capacity`` (galloping search, as fit_training)."""

    def fits(s: int) -> bool:
        return estimate_training(spec, run.model_copy(update={"seq": s})).total_bytes <= capacity

    return gallop(fits, run.seq, 1, 1 << 20)


def _train_run_text(run: dict, gpu: str | None) -> str:
    def v(x: object) -> str:
        return "+".join(x) if isinstance(x, tuple) else str(x)  # type: ignore[arg-type]

    return ", ".join(f"{k}={v(x)}" for k, x in run.items()) + (f", gpu={gpu}" if gpu else "")


def _verdict(m: data.TMapping, mt: data.TMetric, entry: dict, est: Estimate) -> Line:
    """A fits / OOM point: our verdict against the published one."""
    ok = est.total_bytes <= (m.usable_gib or 0) * GiB
    return (
        m.id,
        f"{entry['model']} · {_train_run_text(m.run, m.gpu)}",
        mt.label,
        f"{'fits' if ok else 'OOM'}: total {est.total_bytes / GiB:.2f} GiB of {m.usable_gib} "
        f"GiB (peak {est.peak_bytes / GiB:.2f} GiB)",
        "agree" if ok == bool(mt.measured) else "DISAGREE",
    )


def _figure_row(
    m: data.TMapping, i: int, entry: dict, spec: ModelSpec, run: TrainingRun, est: Estimate
) -> Row:
    """The row of the published figure ``m.metrics[i]`` (a peak, reserved or largest-sequence figure)."""
    mt = m.metrics[i]
    if mt.ours == "max_seq":
        ours = float(max_seq(spec, run, find_gpu(m.gpu or "").memory_bytes) or 0)
        est = estimate_training(spec, run.model_copy(update={"seq": int(ours)}))
        unit, per_unit = "tokens", 0.0
    else:
        ours = float(ours_train(est, mt.ours))
        unit, per_unit = "bytes", 1.0
    row = Row(
        table="train-published",
        kind=mt.kind,
        sort_key=(m.id, i),
        setup=f"{m.id}: {entry['model']}",
        measured=float(mt.measured),
        ours=ours,
        unit=unit,
        bytes_per_unit=per_unit,
        metric=mt.label,
        source=m.id,
    )
    if abs(row.err) > REASON_THRESHOLD:
        ctx = TCtx(spec, run, est, row.measured, ours)
        why = explain(mt.reason, TRAINING_FIELDS, ctx) if mt.reason else "no reason recorded: investigate"
        row = replace_row(row, reason=why)
    return row


def published_training_rows(
    entries: list[dict], ids: Iterable[str] | None = None
) -> tuple[list[Row], list[Line], list[Line]]:
    """Rows for the mapped published training points, the mapping lines, and the fits/OOM verdicts."""
    by_id = {e["id"]: e for e in entries}
    wanted = set(ids) if ids is not None else None
    rows: list[Row] = []
    mapping: list[Line] = []
    bounds: list[Line] = []
    for m in PUBLISHED_TRAINING:
        if wanted is not None and m.id not in wanted:
            continue
        entry = by_id[m.id]
        spec = train_spec(m.model)
        run = make_training_run(**m.run)
        est = estimate_training(spec, run)
        # a reserved or nvidia-smi figure is compared with the caching allocator model's prediction
        on = make_training_run(**{**m.run, "allocator_model": True})
        est_on = estimate_training(spec, on) if any(mt.ours in ALLOCATOR_KEYS for mt in m.metrics) else est
        numbers = "; ".join(f"{mt.label} ↔ {TRAIN_OURS[mt.ours]}" for mt in m.metrics)
        model = m.model + (f" (twin: {m.twin})" if m.twin else " (the published model)")
        mapping.append((m.id, model, _train_run_text(m.run, m.gpu), numbers, m.assumptions))
        for i, mt in enumerate(m.metrics):
            if mt.ours == "fits":
                bounds.append(_verdict(m, mt, entry, est))
            else:
                pair = (on, est_on) if mt.ours in ALLOCATOR_KEYS else (run, est)
                rows.append(_figure_row(m, i, entry, spec, *pair))
    return sorted(rows, key=lambda r: r.sort_key), sorted(mapping), sorted(bounds)
