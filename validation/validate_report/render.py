"""The Markdown report: a summary, then one section per comparison, then the versions."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

from .common import HERE, REASON_THRESHOLD, GiB, MiB, Report, Row
from .distributed import (
    distributed_summary,
    published_runs_summary,
    render_distributed,
    render_published_runs,
)
from .engines import engine_summary, render_engines
from .published_ooms import ooms_summary, render_ooms
from .text import HEADER, PEERS_INTRO, REAL_GPU_INTRO, REAL_GPU_MISSING, TRAIN_INTRO, TRAIN_PEERS_INTRO
from .traced import render_traced

Add = Callable[[str], None]
PeerColumn = tuple[str, Callable[[dict], float | None], Callable[[dict], str | None]]

INFER_PEER_COLUMNS: list[PeerColumn] = [
    ("gpumem", lambda d: d["ours"], lambda d: None),
    ("llm-analysis", lambda d: d["llm_analysis"], lambda d: d["llm_analysis_error"]),
    ("accelerate", lambda d: d["accelerate"], lambda d: d["accelerate_error"]),
    (
        "accelerate +20 %",
        lambda d: d["accelerate"] * 1.2 if d["accelerate"] is not None else None,
        lambda d: None,
    ),
]
TRAIN_PEER_COLUMNS: list[PeerColumn] = [
    ("gpumem", lambda d: d["ours"], lambda d: None),
    ("llm-analysis", lambda d: d["llm_analysis"], lambda d: d["llm_analysis_error"]),
    ("accelerate, float16 row", lambda d: d["accelerate"], lambda d: d["accelerate_error"]),
    ("accelerate, float32 row", lambda d: d["accelerate_fp32"], lambda d: d["accelerate_error"]),
]


# ---- cells ------------------------------------------------------------------------------------------------


def fmt_value(v: float, unit: str) -> str:
    if unit == "bytes":
        return f"{v / GiB:.3f} GiB" if v >= GiB else f"{v / MiB:.2f} MiB"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:,.0f} {unit}"


def pct(x: float) -> str:
    return f"{x * 100:+.2f} %" if round(x * 100, 2) else "+0.00 %"


def _gib_note(r: Row) -> str:
    return f" ({r.err_gib:+.3f} GiB)" if r.bytes_per_unit else ""


def esc(text: str) -> str:
    return text.replace("|", "\\|")


# ---- the summary ------------------------------------------------------------------------------------------


def _summary(rows: list[Row]) -> list[str]:
    """One line per kind of number: median and worst |error|."""
    kinds: dict[str, list[Row]] = {}
    for r in rows:
        kinds.setdefault(r.kind, []).append(r)
    out = []
    for kind in sorted(kinds):
        rs = kinds[kind]
        errs = [abs(r.err) for r in rs]
        worst = max(rs, key=lambda r: abs(r.err))
        out.append(
            f"- **{kind}** ({len(rs)} point{'s' if len(rs) > 1 else ''}): median |error| "
            f"{statistics.median(errs) * 100:.2f} %, worst {pct(worst.err)}{_gib_note(worst)} at "
            f"{worst.setup}" + (f" — {worst.metric}" if worst.metric else "")
        )
    return out


def _kv_summary(grid: list[Row]) -> str:
    kv_rows = [r for r in grid if r.kv_measured]
    kv_exact = sum(1 for r in kv_rows if r.kv_ours == r.kv_measured)
    kv_errs = [abs((r.kv_ours or 0) - (r.kv_measured or 0)) / (r.kv_measured or 1) for r in kv_rows]
    return (
        f"- **KV cache bytes (DynamicCache)** ({len(kv_rows)} points): {kv_exact} exact to the byte; "
        f"median |error| {statistics.median(kv_errs) * 100:.2f} %, worst {max(kv_errs) * 100:.2f} %"
    )


def _render_summary(rep: Report, add: Add) -> None:
    add("## Summary")
    add("")
    for line in _summary(rep.grid):
        add(line)
    if rep.grid:
        add(_kv_summary(rep.grid))
    for rows in (rep.published, [*rep.train, *rep.train_phases], rep.train_published):
        for line in _summary(rows):
            add(line)
    if rep.train_bounds:
        agree = sum(1 for b in rep.train_bounds if b[-1] == "agree")
        add(f"- **published fits / OOM verdicts** ({len(rep.train_bounds)} points): {agree} agree")
    if rep.ranks:
        add(distributed_summary(rep.ranks))
    if rep.engines is not None:
        for line in engine_summary(rep.engines):
            add(line)
    if rep.ooms:
        add(ooms_summary(rep.ooms))
    runs_line = published_runs_summary(rep.published_runs)
    if runs_line:
        add(runs_line)
    if rep.peers:
        add(
            f"- **peers, inference grid** ({len(rep.peers)} points), median |error|: "
            f"{_peer_summary(rep.peers, INFER_PEER_COLUMNS)}"
        )
    if rep.train_peers:
        add(
            f"- **peers, training grid** ({len(rep.train_peers)} full fine-tune points), median |error|: "
            f"{_peer_summary(rep.train_peers, TRAIN_PEER_COLUMNS)}"
        )
    worst = sorted([*rep.grid, *rep.published, *rep.train, *rep.train_published], key=lambda r: -abs(r.err))
    if worst:
        add("")
        add("Largest errors:")
        add("")
        for r in worst[:5]:
            what = f" `{r.metric}`" if r.metric else ""
            add(f"1. {pct(r.err)}{_gib_note(r)}: {r.setup}{what}")


# ---- (a) and (b) ------------------------------------------------------------------------------------------


def _render_grid(rep: Report, add: Add) -> None:
    add(f"## (a) PyTorch-measured grid: {len(rep.grid)} inference points")
    add("")
    add("| setup | measured peak (allocated) | ours | error % | error GiB | KV measured | KV ours | reason |")
    add("|---|---|---|---|---|---|---|---|")
    for r in rep.grid:
        kv_m = fmt_value(r.kv_measured, "bytes") if r.kv_measured is not None else "-"
        kv_o = fmt_value(r.kv_ours, "bytes") if r.kv_ours is not None else "-"
        add(
            f"| {r.setup} | {fmt_value(r.measured, 'bytes')} | {fmt_value(r.ours, 'bytes')} | "
            f"{pct(r.err)} | {r.err_gib:+.3f} | {kv_m} | {kv_o} | {esc(r.reason)} |"
        )


def _render_published(rep: Report, add: Add) -> None:
    add("## (b) Published inference points")
    add("")
    add("### Mapping")
    add("")
    add("| id | model spec used | run | published line ↔ our number | assumptions |")
    add("|---|---|---|---|---|")
    for mid, model, run, numbers, assumptions in rep.mapping:
        add(f"| {mid} | {esc(model)} | `{run}` | {esc(numbers)} | {esc(assumptions)} |")
    tables = (
        ("transformers", "transformers peaks"),
        ("llama.cpp", "llama.cpp buffers"),
        ("vllm", "vLLM profiles"),
    )
    for table, title in tables:
        rows = [r for r in rep.published if r.table == table]
        if not rows:
            continue
        add("")
        add(f"### {title}")
        add("")
        add("| setup | measured (kind) | ours | error % | error GiB | reason |")
        add("|---|---|---|---|---|---|")
        for r in rows:
            add(
                f"| {esc(r.setup)} | `{esc(r.metric)}` ({r.kind}) | {fmt_value(r.ours, r.unit)} | "
                f"{pct(r.err)} | {r.err_gib:+.3f} | {esc(r.reason)} |"
            )
    add("")
    add("### Not reproduced, and why")
    add("")
    add("| id | model | mode | why |")
    add("|---|---|---|---|")
    for pid, model, mode, why in rep.not_reproduced:
        add(f"| {pid} | {esc(model)} | {esc(mode)} | {esc(why)} |")


# ---- (c) peers --------------------------------------------------------------------------------------------


def _peer_errors(rows: list[dict], columns: list[PeerColumn]) -> dict[str, list[float]]:
    """|error| of every tool on every row where it gave a number."""
    errs: dict[str, list[float]] = {c[0]: [] for c in columns}
    for d in rows:
        for name, value, _ in columns:
            v = value(d)
            if v is not None:
                errs[name].append(abs(v - d["measured"]) / d["measured"])
    return errs


def _peer_summary(rows: list[dict], columns: list[PeerColumn]) -> str:
    errs = _peer_errors(rows, columns)
    return "; ".join(
        f"{name} {statistics.median(es) * 100:.1f} % (worst {max(es) * 100:.1f} %)"
        for name, es in errs.items()
        if es
    )


def _peer_table(add: Add, rows: list[dict], columns: list[PeerColumn]) -> None:
    """A setup | measured | one column per tool table, then each tool's median and worst |error|."""
    add("| setup | measured | " + " | ".join(c[0] for c in columns) + " |")
    add("|---|---|" + "---|" * len(columns))

    def cell(v: float | None, meas: float, err_text: str | None) -> str:
        if v is None:
            return f"n/a ({esc(err_text)})" if err_text else "n/a"
        return f"{v / GiB:.3f} ({pct((v - meas) / meas)})"

    for d in rows:
        m = d["measured"]
        cells = " | ".join(cell(value(d), m, why(d)) for _, value, why in columns)
        add(f"| {d['setup']} | {m / GiB:.3f} GiB | {cells} |")
    add("")
    for name, es in _peer_errors(rows, columns).items():
        if es:
            add(
                f"- **{name}**: {len(es)} points, median |error| {statistics.median(es) * 100:.1f} %, worst "
                f"{max(es) * 100:.1f} %"
            )


def _render_peers(rep: Report, add: Add) -> None:
    add("## (c) Peers on the grid points")
    add("")
    if not rep.peers:
        add(rep.peers_note or "Peers were not run.")
        return
    add(PEERS_INTRO)
    _peer_table(add, rep.peers, INFER_PEER_COLUMNS)


def _render_train_peers(rep: Report, add: Add) -> None:
    add("### Peers on the training grid")
    add("")
    if not rep.train_peers:
        add(rep.peers_note or "Peers were not run.")
        return
    add(TRAIN_PEERS_INTRO)
    _peer_table(add, rep.train_peers, TRAIN_PEER_COLUMNS)


# ---- (d) training -----------------------------------------------------------------------------------------


def _render_train_grid(rep: Report, add: Add) -> None:
    add("### PyTorch-measured grid")
    add("")
    add(
        "| setup | measured peak | ours | error % | error GiB | forward meas / ours / err | backward meas / "
        "ours / err | optimizer meas / ours / err | reason |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for r in rep.train:
        cells = " | ".join(f"{m / GiB:.3f} / {o / GiB:.3f} / {pct((o - m) / m)}" for m, o in r.phases)
        add(
            f"| {r.setup} | {fmt_value(r.measured, 'bytes')} | {fmt_value(r.ours, 'bytes')} | "
            f"{pct(r.err)} | {r.err_gib:+.3f} | {cells} | {esc(r.reason)} |"
        )


def _render_train_published(rep: Report, add: Add) -> None:
    add("### Published training points: mapping")
    add("")
    add("| id | model spec used | run | published figure ↔ our number | assumptions |")
    add("|---|---|---|---|---|")
    for mid, model, run, numbers, assumptions in rep.train_mapping:
        add(f"| {mid} | {esc(model)} | `{run}` | {esc(numbers)} | {esc(assumptions)} |")
    add("")
    add("### Published training points: results")
    add("")
    add("| setup | published (kind) | measured | ours | error % | error GiB | reason |")
    add("|---|---|---|---|---|---|---|")
    for r in rep.train_published:
        gib = f"{r.err_gib:+.3f}" if r.unit == "bytes" else "-"
        add(
            f"| {esc(r.setup)} | {esc(r.metric)} ({r.kind}) | {fmt_value(r.measured, r.unit)} | "
            f"{fmt_value(r.ours, r.unit)} | {pct(r.err)} | {gib} | {esc(r.reason)} |"
        )
    if rep.train_bounds:
        add("")
        add("### Published fits / OOM points")
        add("")
        add("| id | setup | published | ours | verdict |")
        add("|---|---|---|---|---|")
        for b in rep.train_bounds:
            add("| " + " | ".join(esc(x) for x in b) + " |")


def render_training(rep: Report, add: Add) -> None:
    add(f"## (d) Training: {len(rep.train)} PyTorch-measured points and {len(rep.train_mapping)} published")
    add("")
    add(TRAIN_INTRO)
    _render_train_grid(rep, add)
    add("")
    _render_train_peers(rep, add)
    add("")
    _render_train_published(rep, add)


# ---- (e) real GPU -----------------------------------------------------------------------------------------


def render_real_gpu(add: Add) -> None:
    """Section (e): each ``validation/gpu_results/*.json`` that ``validation/gpu_check.py`` wrote."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import gpu_compare

    add("## (e) Real GPU: allocated, reserved and NVML used")
    add("")
    add(REAL_GPU_INTRO)
    add("")
    files = gpu_compare.result_files()
    if not files:
        add(REAL_GPU_MISSING)
        return
    for f in files:
        for line in gpu_compare.render(json.loads(f.read_text())):
            add(line)
        add("")
        add(f"(from `validation/gpu_results/{f.name}`)")
        add("")


# ---- the whole report -------------------------------------------------------------------------------------


def render(rep: Report) -> str:
    ref = rep.versions.get("reference: torch / transformers", "? / ?").split(" / ")
    lines: list[str] = [HEADER.format(torch=ref[0], transformers=ref[-1], threshold=REASON_THRESHOLD)]
    add = lines.append
    _render_summary(rep, add)
    add("")
    for section in (_render_grid, _render_published, _render_peers, render_training):
        section(rep, add)
        add("")
    render_real_gpu(add)
    add("")
    render_traced(add)
    add("")
    if rep.ranks:
        render_distributed(rep.ranks, add)
        add("")
    render_published_runs(rep.published_runs, add)
    add("")
    if rep.engines is not None:
        render_engines(rep.engines, add)
        add("")
    if rep.ooms:
        render_ooms(rep.ooms, add)
        add("")
    add("## Versions")
    add("")
    for k, v in rep.versions.items():
        add(f"- {k}: {v}")
    add("")
    return "\n".join(lines)
