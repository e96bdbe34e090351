"""The speed goals for ``benchmarks/report.py``: (goal, measured, verdict) rows from one run's measurements.

Shared by the page (:mod:`benchmarks.report_render`) and the README's speed block (``report.readme_block``).
"""

from __future__ import annotations

from benchmarks import bench_core, bench_training

MiB = 1 << 20
GOAL_PEER_X = 10
GOAL_META_X = 10_000
GOAL_COLD_START_S = 1.0
GOAL_REDRAW_MS = 16.0
GOAL_FLIP_GROWTH_BYTES = 1 << 20  # issue 18: under 1 MiB of growth over the soak's second half
# trace mode (issue 13): (row name in bench_trace.CASES, goal in seconds)
TRACE_GOALS = (
    ("8B inference point (in process)", 1.0),
    ("8B training step (in process)", 3.0),
    ("8B inference point (fresh subprocess)", 5.0),
    ("8B inference point (cached)", 0.010),
)
TRAIN_UNCACHED = "estimate: training full ZeRO-3 dp8 x TP2, uncached"
# issue 30: any estimate at a new point of a known model and run shape (the step's tape) against llm-analysis
TRAIN_NEW_POINT = bench_training.NEW_POINT.format("ZeRO-3 dp8 x TP2")
SWEEP = f"sweep: {bench_core.SWEEP_POINTS} points over seq (one process)"

Row = tuple[str, str, str]

fmt_time = bench_core.fmt_time


def fmt_mib(b: float) -> str:
    return f"{b / MiB:.1f} MiB"


def fmt_ratio(a: float, b: float) -> str:
    """How many times ``a`` is ``b`` (a ratio of times), written for a reader."""
    r = a / b
    if r < 1:
        return f"{r:.3f}x (ours {1 / r:,.0f}x slower)" if r < 0.1 else f"{r:.2f}x (ours slower)"
    return f"{r:,.0f}x" if r >= 100 else f"{r:.1f}x"


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def goals(data: dict) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) rows."""
    core = {r["name"]: r for r in data["core"]}
    base = core[bench_core.BASELINE]["median_s"]
    sweep = core[SWEEP]["median_s"]
    rows = [
        (
            "one inference estimate < 50 µs",
            f"{fmt_time(base)} (Llama-3.1-8B, batch 1, 4096 tokens)",
            met(base < bench_core.GOAL_ESTIMATE_S),
        ),
        (
            f"{bench_core.SWEEP_POINTS}-point sweep < 20 ms",
            f"{fmt_time(sweep)} ({fmt_time(sweep / bench_core.SWEEP_POINTS)} a point)",
            met(sweep < bench_core.GOAL_SWEEP_S),
        ),
    ]
    rows += _llm_analysis_goals(data["llm_analysis"], core, base)
    rows += _accelerate_goals(data["accelerate"], base)
    rows += _app_goals(data)
    rows += _trace_goals(data.get("trace"))
    return rows


def _trace_goals(tr: dict | None) -> list[Row]:
    if not tr or "missing" in tr:
        why = (tr or {}).get("missing", "not measured in this run")
        return [("trace mode (`gpumem trace`)", f"not measured: {why}", "-")]
    by_name = {r["name"]: r["trace_s"] for r in tr["rows"]}
    rows: list[Row] = []
    for name, goal_s in TRACE_GOALS:
        goal = f"trace: {name} ≤ {fmt_time(goal_s)}"
        s = by_name.get(name)
        rows.append((goal, "not measured", "-") if s is None else (goal, fmt_time(s), met(s <= goal_s)))
    return rows


def _llm_analysis_goals(la: dict, core: dict[str, dict], base: float) -> list[Row]:
    if "missing" in la:
        return [(f"≥ {GOAL_PEER_X}x faster than llm-analysis", f"not measured: {la['missing']}", "-")]
    rows: list[Row] = [
        (
            f"≥ {GOAL_PEER_X}x faster than llm-analysis, inference estimate",
            f"{fmt_ratio(la['infer_s'], base)} ({fmt_time(la['infer_s'])} vs ours {fmt_time(base)})",
            met(la["infer_s"] / base >= GOAL_PEER_X),
        )
    ]
    new_point = TRAIN_NEW_POINT in core  # older runs measured the uncached estimate only
    ours_train = core[TRAIN_NEW_POINT if new_point else TRAIN_UNCACHED]["median_s"]
    what = "a new point of a known shape" if new_point else "uncached"
    slower = ours_train / la["train_s"]
    rows.append(
        (
            f"≥ {GOAL_PEER_X}x faster than llm-analysis, training estimate (ZeRO-3, dp 8 x TP 2)",
            f"we are {slower:,.0f}x **slower** ({fmt_time(ours_train)} {what} vs {fmt_time(la['train_s'])})"
            if slower > 1
            else fmt_ratio(la["train_s"], ours_train),
            met(la["train_s"] / ours_train >= GOAL_PEER_X),
        )
    )
    return rows


def _accelerate_goals(acc: dict, base: float) -> list[Row]:
    if "missing" in acc:
        return [(f"≥ {GOAL_META_X:,}x faster than a meta model", f"not measured: {acc['missing']}", "-")]
    return [
        (
            f"≥ {GOAL_META_X:,}x faster than building a meta model (warm, in one process)",
            f"{fmt_ratio(acc['warm_build_s'], base)} ({fmt_time(acc['warm_build_s'])} a build)",
            met(acc["warm_build_s"] / base >= GOAL_META_X),
        ),
        (
            f"≥ {GOAL_META_X:,}x faster than a meta model as its CLI pays it (imports + first build)",
            f"{fmt_ratio(acc['cold_s'], base)} ({fmt_time(acc['cold_s'])})",
            met(acc["cold_s"] / base >= GOAL_META_X),
        ),
    ]


def _app_goals(data: dict) -> list[Row]:
    rows: list[Row] = []
    ui = data.get("ui")
    if ui:
        cs = ui["cold_start"]["first_paint_s_median"]
        charts = ui["cold_start"].get("charts_painted_s_median")
        shown = f"{cs:.2f} s" + (f" (the charts drawn at {charts:.2f} s)" if charts else "")
        rows.append(("cold start to first painted window < 1 s", shown, met(cs < GOAL_COLD_START_S)))
        fc = ui["form_change_to_chart"]
        nd, wd = fc["redraw_ms_median_no_debounce"], fc["redraw_ms_median_with_debounce"]
        rows.append(
            (
                "form change to redrawn chart < 16 ms",
                f"{wd:.1f} ms as the window runs (no debounce for a step); {nd:.1f} ms with the debounce off",
                met(wd < GOAL_REDRAW_MS),
            )
        )
    rows += _flip_soak_goal(data.get("flip_soak"))
    am = data.get("app_memory")
    if am:
        grow = am["rss_second_half_growth_bytes"]
        rows.append(
            (
                f"resident memory bounded over {am['seconds'] / 60:g} min of polling",
                f"{fmt_mib(am['rss_first_paint_bytes'])} at first paint, "
                f"{fmt_mib(am['rss_end_bytes'])} at the end; {grow / MiB:+.1f} MiB over the second half",
                "met" if grow < 2 * MiB else "**growing**",
            )
        )
    return rows


def _flip_soak_goal(fs: dict | None) -> list[Row]:
    """Issue 18's soak: RSS while a local target's verdict flips (``soak_flip.py``; ``report.py --soak``)."""
    goal = "memory flat while a local target's verdict flips (20 Hz x 8 GPUs): < 1 MiB in the second half"
    if not fs:
        return [(goal, "not measured (`report.py --soak`)", "-")]
    grow = fs["rss_second_half_growth_bytes"]
    at = f"`{fs.get('commit', '?')}`" + ("+" if fs.get("dirty") else "")
    when = f"; recorded {fs.get('date', '?')} at {at}" if fs.get("recorded") else ""
    span = f"{fs['seconds'] / 60:g} min" if fs["seconds"] >= 60 else f"{fs['seconds']:g} s"
    measured = f"{grow / MiB:+.2f} MiB over the second half of {span} ({fs['flips']:,} flips{when})"
    return [(goal, measured, "met" if grow < GOAL_FLIP_GROWTH_BYTES and fs["flips"] > 0 else "**growing**")]
