"""Published real-GPU training memory against gpumem's estimate, point by point.

Reads ``validation/data/published_training_runs/points.json`` (each point: source, quote, what was
measured and the run in gpumem's TrainingRun fields), estimates every run with the core as it is now, and
writes ``docs/validation-training.md`` (a table per framework, median and worst error, a reason for every
error above 5 %) and ``validation/data/published_training_runs/result.json``.

Like with like: a published ``allocated`` / ``active`` peak is compared with ``peak_bytes`` (live tensors
at the peak on the most-loaded GPU); ``reserved`` with the caching allocator model's reserved peak (the
phases' ``reserved_bytes``: ``torch.cuda.max_memory_reserved`` on a GPU with room) plus the cuBLAS
workspace, or, with the model off, ``total_bytes`` less the CUDA context (peak + cuBLAS workspace + allocator
reserve); ``nvidia-smi`` with that plus the CUDA context and NCCL's buffers (nvidia-smi shows every cached
block). A
figure whose statistic the source does not name (``unclear``) is compared with ``peak_bytes`` and the
reason names our reserved figure too. A run the core rejects is reported as "not yet estimable: <its
error line>", not dropped.

Usage: ``.venv/bin/python validation/published_training.py [--points P] [--doc D] [--result R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpumem_gui.core.errors import GpumemError  # noqa: E402
from gpumem_gui.core.readers.loader import load_model  # noqa: E402
from gpumem_gui.core.results.estimate import Estimate  # noqa: E402
from gpumem_gui.core.results.reported import nvidia_smi_prediction, reserved_prediction  # noqa: E402
from gpumem_gui.core.spec.model import ModelSpec  # noqa: E402
from gpumem_gui.core.training import TrainingRun, estimate_training, make_training_run  # noqa: E402

DATA = REPO / "validation" / "data" / "published_training_runs"
POINTS = DATA / "points.json"
RESULT = DATA / "result.json"
DOC = REPO / "docs" / "validation-training.md"
GiB = 1 << 30
THRESHOLD = 0.05  # errors above this carry a reason
KINDS = ("allocated", "active", "reserved", "nvidia-smi", "unclear")
UNITS = {"GB": 10**9, "GiB": GiB, "MiB": 1 << 20}
GROUP_TITLES = {
    "torchtitan": "torchtitan (FSDP2 / TP / PP / CP, float8, compile)",
    "torchtune": "torchtune (single device and FSDP2 recipes)",
    "fsdp_qlora": "Answer.AI fsdp_qlora (FSDP1 + QLoRA / LoRA)",
    "hf-trl": "Hugging Face PEFT docs (TRL SFTTrainer + accelerate DeepSpeed / FSDP)",
    "deepspeed": "DeepSpeed ZeRO (LLaMA-7B benchmark gist)",
    "axolotl": "Axolotl (QLoRA on MoE models: the routed experts' storage)",
}
OURS_TEXT = {
    "allocated": "peak_bytes (live tensors at the peak)",
    "active": "peak_bytes (live tensors at the peak)",
    "unclear": "peak_bytes (the source does not name its statistic)",
    "reserved": "the allocator model's reserved peak + workspace (torch.cuda.max_memory_reserved; "
    "--allocator-model)",
    "nvidia-smi": "the reserved peak + workspace + CUDA context + NCCL buffers (every cached block)",
}
REQUIRED = (
    "id", "group", "source", "quote", "model", "setup", "measured", "run", "unmodelled", "setup_known",
)  # fmt: skip
REQUIRED_MEASURED = ("kind", "value", "unit", "unit_assumed", "bytes")


class PointError(ValueError):
    """A point of the data file that does not follow its schema (the message names the point and field)."""


def check_point(p: dict[str, Any], i: int) -> None:
    """Raise :class:`PointError` when ``p`` misses a field, names an unknown kind or unit, or its bytes do not
    follow from value x unit."""
    where = f"points[{i}] ({p.get('id', '?')})"
    for k in REQUIRED:
        if k not in p:
            raise PointError(f"{where}: missing {k!r}")
    if not str(p["source"]).strip() or not str(p["quote"]).strip():
        raise PointError(f"{where}: empty source or quote")
    m = p["measured"]
    for k in REQUIRED_MEASURED:
        if k not in m:
            raise PointError(f"{where}.measured: missing {k!r}")
    if m["kind"] not in KINDS:
        raise PointError(f"{where}.measured.kind: {m['kind']!r} is not one of {', '.join(KINDS)}")
    if m["unit_assumed"] not in UNITS:
        raise PointError(
            f"{where}.measured.unit_assumed: {m['unit_assumed']!r} is not one of {', '.join(UNITS)}"
        )
    if m["unit"] not in (*UNITS, "unstated"):
        raise PointError(f"{where}.measured.unit: {m['unit']!r} is not a published unit or 'unstated'")
    if m["unit"] != "unstated" and m["unit"] != m["unit_assumed"]:
        raise PointError(f"{where}.measured: a stated unit {m['unit']!r} is the one assumed")
    if not isinstance(m["bytes"], int) or m["bytes"] != round(m["value"] * UNITS[m["unit_assumed"]]):
        raise PointError(f"{where}.measured.bytes: {m['bytes']!r} is not value x {m['unit_assumed']}")
    if not isinstance(p["run"], dict) or not isinstance(p["unmodelled"], list):
        raise PointError(f"{where}: run is a dict and unmodelled a list")
    if "reason" in p and (not isinstance(p["reason"], str) or not p["reason"].strip()):
        raise PointError(f"{where}.reason: an explanation in words, or no reason field")


def load_data(path: Path = POINTS) -> dict[str, Any]:
    """The data file: ``points`` (each checked by :func:`check_point`, ids unique) and ``not_collected``."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    for k in ("about", "schema", "points"):
        if k not in raw:
            raise PointError(f"{path.name}: missing {k!r}")
    points = raw["points"]
    for i, p in enumerate(points):
        check_point(p, i)
    ids = [p["id"] for p in points]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise PointError(f"ids appear twice: {', '.join(dup)}")
    return raw


@dataclass
class Outcome:
    """One point against gpumem: ``ours`` is None when the core cannot estimate the run (``status``
    says why)."""

    id: str
    group: str
    model: str
    setup: str
    kind: str
    measured_bytes: int
    published: str
    ours_bytes: int | None = None
    ours_is: str = ""
    error: float | None = None
    status: str = "estimated"
    reason: str = ""
    setup_known: bool = True
    peak_bytes: int | None = None
    total_bytes: int | None = None
    reserved_bytes: int | None = None
    components: dict[str, int] = field(default_factory=dict)


def ours_for(kind: str, est: Estimate) -> int:
    """Our number for a published figure of ``kind`` (see the module docstring)."""
    if kind == "reserved":
        return reserved_prediction(est)
    if kind == "nvidia-smi":
        return nvidia_smi_prediction(est)
    return est.peak_bytes


def _gib(b: float) -> str:
    return f"{b / GiB:.2f}"


# framework tricks a run may set; a reason names those the estimate does not react to (yet)
TRICKS = (
    "compile", "float8", "optimizer_in_backward", "activation_offload", "loss", "ckpt_policy",
    "sequence_parallel", "pp_schedule", "fsdp_version", "framework",
)  # fmt: skip


def ignored_tricks(spec: ModelSpec, run: dict[str, Any], est: Estimate) -> list[str]:
    """The trick fields of ``run`` whose removal leaves the estimate byte-identical: the core does not
    model them for this run yet."""
    defaults = TrainingRun.model_fields
    out = []
    for k in TRICKS:
        if k not in run or run[k] == defaults[k].default:
            continue
        try:
            other = estimate_training(spec, make_training_run(**{**run, k: defaults[k].default}))
        except GpumemError:
            continue
        if (other.peak_bytes, other.total_bytes) == (est.peak_bytes, est.total_bytes):
            out.append(f"{k}={run[k]}")
    return out


def reason(p: dict[str, Any], o: Outcome, ignored: list[str]) -> str:
    """Why ``o`` is off: the direction and size, our largest components, the measured statistic's gap,
    what the run needs that gpumem does not model, and the point's own sourced ``reason`` where it has one."""
    assert o.error is not None and o.ours_bytes is not None
    diff = o.ours_bytes - o.measured_bytes
    top = sorted(o.components.items(), key=lambda kv: -kv[1])[:4]
    parts = [
        f"ours {'over' if diff > 0 else 'under'} by {abs(diff) / GiB:.2f} GiB; largest of ours: "
        + ", ".join(f"{k} {_gib(v)}" for k, v in top)
    ]
    if o.kind == "unclear" and o.reserved_bytes is not None:
        parts.append(f"if the figure is reserved, ours is {_gib(o.reserved_bytes)} GiB")
    if o.kind in ("nvidia-smi",):
        parts.append(
            "nvidia-smi also holds kernels loaded after the idle CUDA context and NCCL's tree / NVLS "
            "buffers, which gpumem does not count"
        )
    if ignored:
        parts.append("ours does not change with " + ", ".join(ignored))
    unm = [u["what"] for u in p["unmodelled"]]
    if unm:
        parts.append("not modelled: " + "; ".join(unm))
    if p.get("reason"):
        parts.append("why: " + p["reason"])
    if not p["setup_known"]:
        parts.append("setup partly unpublished (left out of the medians)")
    return " — ".join(parts)


def setup_text(run: dict[str, Any]) -> str:
    """The run in one line, the fields a reader needs first."""
    keys = (
        "framework", "method", "precision", "optimizer", "batch", "seq", "grad_accum", "grad_ckpt",
        "ckpt_policy", "dp", "tp", "pp", "cp", "zero", "fsdp", "fsdp_version", "offload", "lora_rank",
        "loss", "optimizer_in_backward", "activation_offload", "compile", "float8", "sequence_parallel",
        "pp_schedule",
    )  # fmt: skip
    out = []
    for k in keys:
        if k in run and run[k] not in (False, None, "none", 0):
            v = run[k]
            out.append(k if v is True else f"{k}={v}")
    return ", ".join(out)


def evaluate(p: dict[str, Any]) -> Outcome:
    """Estimate one point's run and compare it with the published figure."""
    m = p["measured"]
    o = Outcome(
        id=p["id"],
        group=p["group"],
        model=p["model"],
        setup=setup_text(p["run"]),
        kind=m["kind"],
        measured_bytes=m["bytes"],
        published=f"{m['value']} {m['unit']}"
        if m["unit"] != "unstated"
        else f"{m['value']} (no unit; read as {m['unit_assumed']})",
        setup_known=bool(p["setup_known"]),
    )
    model = str(REPO / p["model"]) if p["model"].endswith(".json") else p["model"]
    try:
        spec = load_model(model).spec
        # a reserved or nvidia-smi figure is gpumem's reserved prediction: the caching allocator model's
        # (--allocator-model; off by default for speed), unless the point's run says otherwise
        model_on = {"allocator_model": True} if m["kind"] in ("reserved", "nvidia-smi") else {}
        run = make_training_run(**{**model_on, **p["run"]})
        est = estimate_training(spec, run)
    except GpumemError as e:
        o.status = f"not yet estimable: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return o
    o.ours_bytes, o.ours_is = ours_for(o.kind, est), OURS_TEXT[o.kind]
    o.peak_bytes, o.total_bytes = est.peak_bytes, est.total_bytes
    o.reserved_bytes = ours_for("reserved", est)
    o.components = {c.key: c.bytes for c in est.components}
    o.error = (o.ours_bytes - o.measured_bytes) / o.measured_bytes
    if abs(o.error) > THRESHOLD:
        o.reason = reason(p, o, ignored_tricks(spec, p["run"], est))
    return o


def summarize(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    """Per group (and 'all'): points, estimated, counted (setup known), median |error|, worst error."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.group, []).append(o)
    groups["all"] = list(outcomes)
    out = {}
    for g, os_ in groups.items():
        estimated = [abs(o.error) for o in os_ if o.error is not None]
        counted = [o for o in os_ if o.error is not None and o.setup_known]
        errs = [abs(o.error) for o in counted if o.error is not None]
        worst = max(counted, key=lambda o: abs(o.error or 0), default=None)
        out[g] = {
            "points": len(os_),
            "estimated": sum(o.error is not None for o in os_),
            "not_estimable": sum(o.error is None for o in os_),
            "counted": len(counted),
            "median_abs_error": statistics.median(errs) if errs else None,
            "median_abs_error_all_estimated": statistics.median(estimated) if estimated else None,
            "worst_error": worst.error if worst else None,
            "worst_id": worst.id if worst else None,
            "within_5pct": sum(e <= THRESHOLD for e in errs),
        }
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:+.1f} %"


def _abs_pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f} %"


def _worst(s: dict[str, Any]) -> str:
    return "–" if s["worst_id"] is None else f"{_pct(s['worst_error'])} ({s['worst_id']})"


def render(outcomes: list[Outcome], summary: dict[str, dict[str, Any]], data: dict[str, Any]) -> str:
    """docs/validation-training.md."""
    by_id = {p["id"]: p for p in data["points"]}
    a = summary["all"]
    lines = [
        "# Validation: published real-GPU training memory",
        "",
        "Generated by `validation/published_training.py` from "
        "`validation/data/published_training_runs/points.json` (each point's source URL, exact quote, setup "
        "and measured statistic are there; nothing here is typed by hand). Numbers: "
        "`validation/data/published_training_runs/result.json`. Error = (ours − measured) / measured.",
        "",
        "What is compared: " + "; ".join(f"**{k}** ↔ {v}" for k, v in OURS_TEXT.items()) + ". "
        "Medians and worst count only points whose setup is fully published (`setup_known`); the others "
        "(†) are shown, and counted in the last column only. A run the core rejects is listed as *not yet "
        "estimable* with the core's message.",
        "",
        f"**All: {a['points']} points, {a['estimated']} estimated, {a['counted']} counted, median "
        f"|error| {_abs_pct(a['median_abs_error'])}, worst {_worst(a)}, "
        f"{a['within_5pct']} within 5 %.**",
        "",
        "| framework | points | estimated | counted | median abs error | worst | within 5 % "
        "| median incl. † |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in GROUP_TITLES:
        if g in summary:
            s = summary[g]
            lines.append(
                f"| {g} | {s['points']} | {s['estimated']} | {s['counted']} | "
                f"{_abs_pct(s['median_abs_error'])} | {_worst(s)} | {s['within_5pct']} | "
                f"{_abs_pct(s['median_abs_error_all_estimated'])} |"
            )
    for g, title in GROUP_TITLES.items():
        rows = [o for o in outcomes if o.group == g]
        if not rows:
            continue
        head = "| id | model | run | measured | ours (GiB) | error | reason (above 5 %) |"
        lines += ["", f"## {title}", "", head]
        lines.append("|---|---|---|---|---:|---:|---|")
        for o in rows:
            meas = f"{o.published}, {o.kind} = {_gib(o.measured_bytes)} GiB"
            mark = "" if o.setup_known else " †"
            if o.error is None:
                lines.append(f"| {o.id}{mark} | {o.model} | {o.setup} | {meas} | – | – | {o.status} |")
                continue
            assert o.ours_bytes is not None
            lines.append(
                f"| {o.id}{mark} | {o.model} | {o.setup} | {meas} | {_gib(o.ours_bytes)} | {_pct(o.error)} | "
                f"{o.reason.replace('|', '/')} |"
            )
        sources = sorted({by_id[o.id]["source"] for o in rows})
        lines += ["", "Sources: " + ", ".join(sources) + ". † setup partly unpublished (not in the medians)."]
    missing = data.get("not_collected") or []
    if missing:
        lines += ["", "## Searched for, not collected", ""]
        lines += [f"- {m['what']}: {m['why']}" for m in missing]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=Path, default=POINTS)
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--result", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    data = load_data(args.points)
    outcomes = [evaluate(p) for p in data["points"]]
    summary = summarize(outcomes)
    args.doc.write_text(render(outcomes, summary, data), encoding="utf-8")
    result = {"summary": summary, "points": [asdict(o) for o in outcomes]}
    args.result.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for g, s in summary.items():
        print(
            f"{g:11s} points {s['points']:3d} estimated {s['estimated']:3d} counted {s['counted']:3d} "
            f"median |err| {_abs_pct(s['median_abs_error'])} "
            f"(incl. † {_abs_pct(s['median_abs_error_all_estimated'])}) worst {_worst(s)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
