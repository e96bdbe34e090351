"""Section (g): distributed and framework training per rank against PyTorch's own trackers, and section (h):
the published real-GPU training runs per framework (``docs/validation-training.md``).

(g) reads the ground truth of ``tests/reference/distributed/`` (each file made by its
``validation/truth_*.py``: the real transformers model under FakeTensorMode on torch's fake process group,
counted on one rank by ``MemTracker`` / ``FSDPMemTracker``) and recomputes the estimate of every point with
the core as it is now, mapping each point to its run as the script that wrote the file does. The accuracy
bar itself (every phase within 3 %) is held by ``tests/test_truth_{fsdp,ddp,tp,tricks}.py``.

(h) only links ``docs/validation-training.md`` (``validation/published_training.py``) and repeats the
per-framework medians of its ``result.json``; nothing is recomputed here.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.training import estimate_training

from .common import HERE, REPO, GiB, MiB, short

DIST = REPO / "tests" / "reference" / "distributed"
PUBLISHED_RUNS = HERE / "data" / "published_training_runs" / "result.json"
GOAL = 0.03  # issue 15's goal for every traced point and phase (tests/test_truth_*.py hold it)

Add = Callable[[str], None]


@dataclass(frozen=True)
class RankPoint:
    """One traced rank: the tracker's phase peaks (``Total``) and the estimate's, recomputed now."""

    model: str
    run: str
    rank: str  # which rank the trace measured, or what else the point records (host RAM)
    traced: dict[str, int]
    estimated: dict[str, int]

    @property
    def traced_peak(self) -> int:
        return max(self.traced.values())

    @property
    def estimated_peak(self) -> int:
        return max(self.estimated[ph] for ph in self.traced)

    @property
    def err(self) -> float:
        return (self.estimated_peak - self.traced_peak) / self.traced_peak

    @property
    def worst_phase(self) -> tuple[str, float]:
        errs = {ph: (self.estimated[ph] - t) / t for ph, t in self.traced.items()}
        ph = max(sorted(errs), key=lambda k: abs(errs[k]))
        return ph, errs[ph]


@dataclass(frozen=True)
class TruthFile:
    title: str
    file: str  # the reference file, relative to the repository
    script: str  # the script that made it
    how: str
    versions: str
    points: tuple[RankPoint, ...]


def _run_text(run: dict[str, Any]) -> str:
    def v(x: object) -> str:
        return "+".join(x) if isinstance(x, list | tuple) else str(x)  # type: ignore[arg-type]

    return ", ".join(f"{k}={v(x)}" for k, x in run.items())


def _versions(points: list[dict[str, Any]]) -> str:
    seen = sorted(
        {f"torch {v['torch']}, transformers {v['transformers']}" for p in points if (v := p.get("versions"))}
    )
    return "; ".join(seen) or "not recorded"


def _doc(name: str) -> dict[str, Any]:
    return json.loads((DIST / f"{name}.json").read_text())


def _tracked(kind: str, title: str, how: str) -> TruthFile:
    """FSDP2 and DDP / ZeRO-1 points: ``gpumem trace`` of each run; the estimate is what the trace puts beside
    it (``truth_fsdp.py``'s: the replay of the traced rank folded into the trackers' categories)."""
    from truth_fsdp import _estimate as tracked_estimate

    doc = _doc(kind)
    points = tuple(
        RankPoint(
            model=short(p["model"]),
            run=_run_text(p["run"]),
            rank=p["notes"][0].split(" under ")[0] if p.get("notes") else "-",
            traced={ph: int(s["Total"]) for ph, s in (p.get("traced") or p["phases"]).items()},
            estimated=tracked_estimate(p),
        )
        for p in doc["points"]
    )
    return TruthFile(
        title=title,
        file=f"tests/reference/distributed/{kind}.json",
        script=f"validation/truth_{kind}.py",
        how=how,
        versions=_versions(doc["points"]),
        points=points,
    )


def _tp() -> TruthFile:
    from truth_tp import training_run

    doc = _doc("tp")
    out = []
    for p in doc["points"]:
        run = training_run(p)
        est = estimate_training(spec_from_config(doc["models"][p["model"]], name=p["model"]), run)
        head = "loss-parallel head (torchtitan)" if p["loss_parallel"] else "head gathered (transformers)"
        sp = "SP" if p["sequence_parallel"] else "no SP"
        out.append(
            RankPoint(
                model=p["model"],
                run=f"tp={p['tp']}, {sp}, {head}, {p['precision']}, {p['optimizer']}, "
                f"b{p['batch']} s{p['seq']}",
                rank=f"rank 0 of {p['tp']}",
                traced={ph: int(s["Total"]) for ph, s in p["phases"].items()},
                estimated={ph: est.phases[ph].peak_bytes for ph in p["phases"]},
            )
        )
    how = (
        "rank 0 of a DTensor tensor-parallel group (torchtitan's plan on transformers' modules, with and "
        "without sequence parallelism), `MemTracker`, second optimizer step"
    )
    versions = f"torch {doc['torch']}, transformers {doc['transformers']}"
    return TruthFile(
        title="Tensor parallelism (DTensor)",
        file="tests/reference/distributed/tp.json",
        script="validation/truth_tp.py",
        how=how,
        versions=versions,
        points=tuple(out),
    )


def _size(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB"


def _tricks() -> TruthFile:
    from truth_tricks import estimate

    doc = _doc("tricks")
    out = []
    for p in doc["points"]:
        phases, host = estimate(p["model"], p["run"])
        traced_host = int(p["traced_host_bytes"])
        note = (
            f"host RAM traced {_size(traced_host)} / ours {_size(host)}" if traced_host or host else "one GPU"
        )
        out.append(
            RankPoint(short(p["model"]), f"{p['case']}: {_run_text(p['run'])}", note, p["traced"], phases)
        )
    how = (
        "one (fake) GPU, the trace worker's own request path, `MemTracker`: torchtune's chunked losses, "
        "optimizer in backward, activation offloading, partial and op-level selective checkpointing"
    )
    return TruthFile(
        title="Framework memory tricks",
        file="tests/reference/distributed/tricks.json",
        script="validation/truth_tricks.py",
        how=how,
        versions="not recorded in the file",
        points=tuple(out),
    )


def distributed_files() -> list[TruthFile]:
    """The four ground-truth files, each point with its estimate recomputed."""
    return [
        _tracked(
            "fsdp",
            "FSDP2 (`fully_shard`)",
            "rank 0 of a fake process group, `FSDPMemTracker`, second iteration; mp-bf16 / amp-bf16 / bf16, "
            "reshard after forward on / off / int, HSDP, checkpointing, LoRA, world sizes 2 / 4 / 8",
        ),
        _tracked(
            "ddp",
            "DDP and torch ZeRO-1 (`ZeroRedundancyOptimizer`)",
            "one rank of a fake process group (ZeRO-1: the rank holding the most parameters), "
            "`MemTracker`, second step; gradient buckets (`bucket_cap_mb`, `gradient_as_bucket_view`), "
            "world sizes 2 / 4 / 8",
        ),
        _tp(),
        _tricks(),
    ]


# ---- rendering ---------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x * 100:+.2f} %" if round(x * 100, 2) else "+0.00 %"


def _within(points: tuple[RankPoint, ...] | list[RankPoint]) -> int:
    return sum(1 for p in points if abs(p.worst_phase[1]) <= GOAL and abs(p.err) <= GOAL)


def _stats(points: tuple[RankPoint, ...] | list[RankPoint]) -> str:
    worst = max(points, key=lambda p: abs(p.err))
    phase = max(points, key=lambda p: abs(p.worst_phase[1]))
    ph, e = phase.worst_phase
    return (
        f"median |peak error| {statistics.median(abs(p.err) for p in points) * 100:.2f} %, worst "
        f"{_pct(worst.err)} at {worst.model} · {worst.run}; worst phase {_pct(e)} ({ph}) at {phase.model} · "
        f"{phase.run}; {_within(points)} of {len(points)} within {GOAL * 100:g} % on the peak and every phase"
    )


def distributed_summary(files: list[TruthFile]) -> str:
    """The summary table's line for section (g)."""
    points = [p for f in files for p in f.points]
    if not points:
        return "- **per-rank training vs PyTorch's trackers**: no points (tests/reference/distributed/)"
    return (
        f"- **per-rank training vs PyTorch's trackers (FSDP2, DDP / ZeRO-1, TP, framework tricks)** "
        f"({len(points)} points): {_stats(points)}"
    )


def render_distributed(files: list[TruthFile], add: Add) -> None:
    n = sum(len(f.points) for f in files)
    add(f"## (g) Distributed and framework training per rank vs PyTorch's trackers: {n} points")
    add("")
    add(
        "Each point is one rank of a training step traced on the CPU: the real transformers model under "
        "`FakeTensorMode`, parallelised on torch's fake process group and counted by PyTorch's own "
        "`MemTracker` / `FSDPMemTracker` (phase peaks of a steady-state step). The traced numbers are read "
        "from the file; ours is recomputed from the current core for the same rank. Peak = the largest phase "
        "peak; worst phase = the largest |error| of the forward / backward / optimizer peaks. "
        "`tests/test_truth_{fsdp,ddp,tp,tricks}.py` hold every point to "
        f"{GOAL * 100:g} % (FSDP also per tracker category)."
    )
    for f in files:
        add("")
        add(f"### {f.title}: {len(f.points)} points")
        add("")
        add(f"`{f.file}`, made by `{f.script}`: {f.how}. Versions: {f.versions}.")
        add("")
        if not f.points:
            add("No points.")
            continue
        add(f"- {_stats(f.points)}")
        add("")
        add("| model | run | rank / note | traced peak | ours | error | worst phase error |")
        add("|---|---|---|---|---|---|---|")
        for p in f.points:
            ph, e = p.worst_phase
            add(
                f"| {p.model} | {p.run} | {p.rank} | {_size(p.traced_peak)} | {_size(p.estimated_peak)} | "
                f"{_pct(p.err)} | {_pct(e)} ({ph}) |"
            )


# ---- (h) published runs per framework ----------------------------------------------------------------------


def published_runs() -> dict[str, Any]:
    """``validation/data/published_training_runs/result.json``'s per-framework summary (not recomputed)."""
    if not PUBLISHED_RUNS.is_file():
        return {}
    return dict(json.loads(PUBLISHED_RUNS.read_text())["summary"])


def _med(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f} %"


def _worst(s: dict[str, Any]) -> str:
    return "–" if s["worst_error"] is None else f"{s['worst_error'] * 100:+.1f} % ({s['worst_id']})"


def published_runs_summary(summary: dict[str, Any]) -> str | None:
    s = summary.get("all")
    if not s:
        return None
    return (
        f"- **published real-GPU training runs** ({s['points']} points, {s['counted']} counted; "
        f"docs/validation-training.md): median |error| {_med(s['median_abs_error'])}, worst {_worst(s)}, "
        f"{s['within_5pct']} within 5 %"
    )


def render_published_runs(summary: dict[str, Any], add: Add) -> None:
    add("## (h) Published real-GPU training runs per framework")
    add("")
    add(
        "Training memory published by torchtitan, torchtune, Answer.AI's fsdp_qlora, the PEFT docs and "
        "DeepSpeed is compared run by run in [docs/validation-training.md](validation-training.md), made by "
        "`validation/published_training.py` from `validation/data/published_training_runs/points.json` "
        "(each point's source, quote, setup and measured statistic), with a reason for every error above "
        "5 %. Its per-framework figures, as `validation/data/published_training_runs/result.json` records "
        "them (counted: points whose setup is fully published; † the others):"
    )
    add("")
    if not summary:
        add("Not run yet (`.venv/bin/python validation/published_training.py`).")
        return
    add(
        "| framework | points | estimated | counted | median \\|error\\| | median incl. † | worst "
        "| within 5 % |"
    )
    add("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, s in summary.items():
        label = "**all**" if name == "all" else name
        add(
            f"| {label} | {s['points']} | {s['estimated']} | {s['counted']} | "
            f"{_med(s['median_abs_error'])} | {_med(s['median_abs_error_all_estimated'])} | {_worst(s)} | "
            f"{s['within_5pct']} |"
        )
