"""Section (b): the published inference points we reproduce, and the published points we do not.

Which model spec and run stand for each point, and which of our numbers for each published line, is in
``validation/data/published_inference.json`` (:data:`PUBLISHED`); the points we leave out, with the reason,
in ``validation/data/not_reproduced.json`` (:data:`NOT_REPRODUCED`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpumem_gui.core.readers.catalog import find_gpu
from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run

from . import data
from .common import REASON_THRESHOLD, GiB, MiB, Row, replace_row, spec_for
from .ours import INFERENCE_FIELDS, OURS, Ctx, explain

PUBLISHED: tuple[data.Mapping, ...] = data.published_inference().mappings
NOT_REPRODUCED: dict[str, str] = data.not_reproduced()

MappingLine = tuple[str, str, str, str, str]  # id, model spec, run, numbers, assumptions


def is_training(entry: dict) -> bool:
    mode = (entry.get("mode") or "").lower()
    return not (mode.startswith("inference") or mode.startswith("weights only"))


def parse_value(text: str, unit: str | None = None) -> tuple[float, str]:
    """The last number of a quoted log line and its unit: bytes for MiB/GiB, else a count. ``unit`` names
    the unit of a line that prints a bare number."""
    m = list(re.finditer(r"(\d[\d,]*(?:\.\d+)?)\s*(MiB|GiB|tokens|x)?", text))
    if not m:
        raise ValueError(f"no number in {text!r}")
    num, unit = m[-1].group(1), m[-1].group(2) or unit
    value = float(num.replace(",", ""))
    if unit == "MiB":
        return value * MiB, "bytes"
    if unit == "GiB":
        return value * GiB, "bytes"
    if unit == "tokens":
        return value, "tokens"
    if unit == "x":
        return value, "x"
    return value, "blocks"


def label(quote: str) -> str:
    """A published line without its value: 'KV self size = 1024.00 MiB' -> 'KV self size'."""
    return re.sub(r"[\s:=]*\d[\d,]*(?:\.\d+)?\s*(?:MiB|GiB|tokens|x)?\s*$", "", quote)


def _capacity(m: data.Mapping) -> int | None:
    if m.capacity is None:
        return None
    if isinstance(m.capacity, str):
        return find_gpu(m.capacity).memory_bytes
    return round(m.capacity * GiB)


def _run_text(run: dict, capacity: int | None) -> str:
    text = ", ".join(f"{k}={v}" for k, v in run.items())
    return text + (f", capacity={capacity / GiB:.2f} GiB" if capacity else "")


def _mapping_line(m: data.Mapping, capacity: int | None) -> MappingLine:
    numbers = "; ".join(f"{label(mt.quote)} ↔ {OURS[mt.ours][0]}" for mt in m.metrics)
    model = f"{m.model}" + (f" (twin: {m.twin})" if m.twin else " (the published model)")
    return (m.id, model, _run_text(m.run, capacity), numbers, m.assumptions)


def _bytes_per_unit(unit: str, est: Estimate) -> float:
    """The KV bytes one token, one 16-token block or one full-length request stands for; 1 for bytes."""
    if unit not in ("tokens", "blocks", "x"):
        return 1.0
    per_tok = float(est.facts["kv_bytes_per_token"])  # type: ignore[arg-type]
    return {"tokens": per_tok, "blocks": 16 * per_tok}.get(
        unit,
        per_tok * float(est.facts["max_model_len"]),  # type: ignore[arg-type]
    )


def _metric_rows(m: data.Mapping, entry: dict, capacity: int | None) -> list[Row]:
    """One row per published line of one mapped point."""
    spec = spec_for(m.model)
    run = make_run(**m.run)
    est = estimate_inference(spec, run, capacity)
    table = run.engine
    rows = []
    for i, mt in enumerate(m.metrics):
        if mt.quote not in entry["quote"]:
            raise ValueError(f"{m.id}: {mt.quote!r} is not in the published quote")
        measured, unit = parse_value(mt.quote, mt.unit)
        ours = float(OURS[mt.ours][1](est))
        per_unit = _bytes_per_unit(unit, est)
        row = Row(
            table=table,
            kind=mt.kind,
            sort_key=(m.id, i),
            setup=f"{m.id}: {entry['model']}",
            measured=measured,
            ours=ours,
            unit=unit,
            bytes_per_unit=per_unit,
            metric=mt.quote,
            source=m.id,
            reason=mt.note,
        )
        if abs(row.err) > REASON_THRESHOLD:
            ctx = Ctx(spec, run, est, capacity, measured, ours, per_unit)
            why = (
                explain(mt.reason, INFERENCE_FIELDS, ctx) if mt.reason else "no reason recorded: investigate"
            )
            row = replace_row(row, reason=f"{mt.note}; {why}" if mt.note else why)
        rows.append(row)
    return rows


def published_rows(
    entries: list[dict], ids: Iterable[str] | None = None
) -> tuple[list[Row], list[MappingLine]]:
    """Rows for the mapped published points (all, or ``ids``) and the mapping table's lines."""
    by_id = {e["id"]: e for e in entries}
    wanted = set(ids) if ids is not None else None
    rows: list[Row] = []
    mapping: list[MappingLine] = []
    for m in PUBLISHED:
        if wanted is not None and m.id not in wanted:
            continue
        entry = by_id[m.id]
        capacity = _capacity(m)
        mapping.append(_mapping_line(m, capacity))
        rows.extend(_metric_rows(m, entry, capacity))
    return sorted(rows, key=lambda r: r.sort_key), sorted(mapping)


def published_leftovers(
    entries: list[dict],
) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str]]]:
    """Inference points we do not reproduce (with the reason) and the training points (one line each)."""
    mapped = {m.id for m in PUBLISHED} | {m.id for m in data.published_training().mappings}
    not_rep, training = [], []
    for e in entries:
        if e["id"] in mapped:
            continue
        if is_training(e) and e["id"] not in NOT_REPRODUCED:
            training.append((e["id"], e["model"], f"{e['mode']}; {e['metric']}"))
            continue
        why = NOT_REPRODUCED.get(e["id"], "not mapped yet")
        not_rep.append((e["id"], e["model"], e["mode"], why))
    return sorted(not_rep), sorted(training)
