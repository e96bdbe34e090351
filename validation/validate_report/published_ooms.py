"""Section (j): published CUDA out-of-memory reports that state their setup, against gpumem's fit.

Each report of ``validation/data/published_ooms.json`` is a failure someone posted with the run that caused
it. Its message (a fixture in ``tests/reference/published_ooms/``) is read by ``read_observed``,
the reader ``gpumem diagnose`` uses; its setup, written as a ``gpumem fit`` command on the GPU the message
states, is estimated through the CLI itself (``gpumem estimate ... --json``, margin 0), so a command that
stops parsing or estimating fails here and in ``tests/test_published_ooms.py``.

Two questions per report:

* **predicted?** gpumem says the run does not fit: its fit verdict is "does not fit" or its per-GPU total
  is above the GPU's capacity (the message's total; the catalog's where the message states none).
* **ours vs the least the run needed.** At the failure the process held some memory and asked for more:
  the largest of what the message states for it ("this process has", the one process it lists, reserved,
  allocated) plus the failed request is a lower bound of what the run needed. Ours below it is an
  underestimate by that much; ours above it is consistent (a failure does not say how much more the run
  would have taken).
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import Field, field_validator, model_validator

from gpumem_gui.cli import main as cli_main
from gpumem_gui.core import GpumemInputError, ObservedMemory, read_observed

from . import data
from .common import REASON_THRESHOLD, REPO, GiB

FIXTURES = REPO / "tests" / "reference" / "published_ooms"
DATA_FILE = "published_ooms.json"
REASON_FIELDS = ("ours", "needed", "peak", "capacity")  # what a reason template may name, in GiB
WEIGHT_KEYS = ("weights", "parameters")  # the components that are the model's own weights (core results)
SUBSET = frozenset({"vllm-188", "vllm-751", "whatsapp-clone-12"})  # collect(subset=True): one of each kind


class OomReport(data._Strict):
    """One published report: where it is, its message, its setup and gpumem's command for it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    url: str = Field(pattern=r"^https://\S+$")
    published: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    fixture: str = Field(pattern=r"^[a-z0-9_]+\.txt$")
    setup_quote: str = Field(min_length=1)
    command: str = Field(pattern=r"^gpumem fit \S+ .*--gpu \S+")
    assumptions: str = Field(min_length=1)
    reason: str = ""  # why a report is not predicted, or predicted below what the run held

    @field_validator("fixture")
    @classmethod
    def _fixture_exists(cls, v: str) -> str:
        if not (FIXTURES / v).is_file():
            raise ValueError(f"no fixture {v} in {FIXTURES.relative_to(REPO)}")
        return v

    @field_validator("reason")
    @classmethod
    def _reason_fields(cls, v: str) -> str:
        try:
            v.format(**dict.fromkeys(REASON_FIELDS, ""))
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"the reason names {e} (it may name {', '.join(REASON_FIELDS)})") from None
        return v

    @property
    def argv(self) -> list[str]:
        """The command as ``gpumem estimate`` arguments with the fit in its JSON and no safety margin."""
        return ["estimate", *shlex.split(self.command)[2:], "--margin-mib", "0", "--json"]


class PublishedOoms(data._Strict):
    about: str = Field(min_length=1)
    reports: tuple[OomReport, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _ids(self) -> PublishedOoms:
        data._unique_ids(self.reports)  # type: ignore[arg-type]
        return self


@cache
def published_ooms() -> PublishedOoms:
    return data.load(DATA_FILE, PublishedOoms)


def estimate_doc(entry: OomReport) -> dict[str, Any]:
    """``gpumem estimate`` of the entry's command (its ``gpumem.estimate/1`` document with the fit)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(entry.argv)
    if code:
        raise data.DataFileError(
            f"validation/data/{DATA_FILE}: {entry.id}: command: {err.getvalue().strip()}"
        )
    return json.loads(out.getvalue())


def observed(entry: OomReport) -> ObservedMemory | None:
    """The failing GPU's record read from the fixture (the one with the failed request), or None when the
    text states no figures (a raw ``CUDA error: out of memory``)."""
    try:
        records = read_observed((FIXTURES / entry.fixture).read_text(encoding="utf-8")).records
    except GpumemInputError:
        return None
    failing = [r for r in records if r.requested_bytes is not None]
    return (failing or list(records))[0]


def held_by_run(rec: ObservedMemory) -> tuple[int | None, str]:
    """What the failing process held, and which figure says so: the largest of 'this process has', the one
    process the message lists (another pid namespace: the process itself), reserved and allocated. Several
    processes: only this process's own allocator figures count (the others are not this run)."""
    held: dict[str, int] = {}
    if rec.process_bytes:  # '0 bytes' where NVML sees no usage (WSL, some containers): not a figure
        held["this process"] = rec.process_bytes
    if len(rec.processes) == 1 and rec.processes[0].bytes:
        held["the process it lists"] = rec.processes[0].bytes
    for name in ("reserved_bytes", "allocated_bytes"):
        if getattr(rec, name):
            held[name.removesuffix("_bytes")] = getattr(rec, name)
    if not held:
        return None, ""
    which = max(held, key=lambda k: held[k])
    return held[which], which


@dataclass(frozen=True)
class OomRow:
    """One report against gpumem: what the GPU said and what gpumem says for the same run."""

    entry: OomReport
    rec: ObservedMemory | None
    ours: int  # the most-loaded GPU's total (what nvidia-smi would show)
    peak: int  # that GPU's live tensors at the peak
    weights: int  # that GPU's share of the model's weights
    capacity: int  # CUDA's total per GPU as the fit used it
    fits: bool  # gpumem's fit verdict
    parts: tuple[tuple[str, int], ...] = ()  # that GPU's three largest components (label, bytes)

    @property
    def predicted(self) -> bool:
        return not self.fits or self.ours > self.capacity

    @property
    def held(self) -> tuple[int | None, str]:
        return held_by_run(self.rec) if self.rec is not None else (None, "")

    @property
    def needed(self) -> int | None:
        """At least what the run needed: what it held plus the failed request."""
        held, _ = self.held
        if held is None or self.rec is None or self.rec.requested_bytes is None:
            return None
        return held + self.rec.requested_bytes

    @property
    def gap(self) -> float | None:
        """(ours - needed) / needed: below 0, gpumem is under what the run provably needed."""
        return (self.ours - self.needed) / self.needed if self.needed else None

    @property
    def explained(self) -> bool:
        """A report gpumem misses (not predicted, or under by more than the threshold) carries a reason."""
        return bool(self.entry.reason) or (self.predicted and (self.gap or 0) >= -REASON_THRESHOLD)


def _row(entry: OomReport) -> OomRow:
    doc = estimate_doc(entry)
    gpus = doc.get("per_gpu") or []
    top = max(gpus, key=lambda g: g["total_bytes"]) if gpus else doc
    return OomRow(
        entry=entry,
        rec=observed(entry),
        ours=top["total_bytes"],
        peak=top["peak_bytes"],
        weights=sum(c["bytes"] for c in top["components"] if c["key"] in WEIGHT_KEYS),
        capacity=doc["fit"]["cuda_capacity_bytes"],
        fits=doc["fit"]["fits"],
        parts=tuple(
            (c["label"], c["bytes"]) for c in sorted(top["components"], key=lambda c: -c["bytes"])[:3]
        ),
    )


def published_oom_rows(ids: set[str] | None = None) -> list[OomRow]:
    """A row per report of the data file (only ``ids`` where given), in the file's order."""
    return [_row(e) for e in published_ooms().reports if ids is None or e.id in ids]


# ---- the Markdown section ---------------------------------------------------------------------------------

INTRO = """\
Failures people posted with the run that caused them, each against `gpumem fit` for the same run on the GPU
the message states (its CUDA total, margin 0). The message is read by `read_observed` (the reader of
`gpumem diagnose`); the setup, the command and what had to be assumed are in
`validation/data/published_ooms.json`, the messages in `tests/reference/published_ooms/`.
**Predicted**: gpumem says it does not fit (its verdict, or its per-GPU total above the capacity).
**Held + request**: what the failing process held (the largest of 'this process has', the one process the
message lists, reserved, allocated) plus the allocation that failed, a lower bound of what the run needed;
**ours vs that**: below 0 gpumem is under what the run provably needed (a miss of that size), above 0 it is
consistent (a failure does not say how much more the run would have taken). Several of these failures are
the weights alone not fitting, said in the last column: they check the setup's bookkeeping (sharding,
precision, one process per GPU), not the activation model."""


HEAD = (
    "| report | the GPU said | held + request | gpumem per GPU | predicted | ours vs held + request | why |"
)


def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / GiB:.2f} GiB"


def _said(row: OomRow) -> str:
    rec = row.rec
    if rec is None:
        return "no figures (a raw CUDA error)"
    parts = [f"capacity {_gib(rec.total_bytes)}"]
    held, which = row.held
    if held is not None:
        parts.append(f"{which} {_gib(held)}")
    if len(rec.processes) > 1:
        parts.append("processes " + " + ".join(_gib(p.bytes) for p in rec.processes))
    if rec.requested_bytes is not None:
        parts.append(f"failed to allocate {_gib(rec.requested_bytes)}")
    return "; ".join(parts)


def _vs(row: OomRow) -> str:
    gap = row.gap
    if gap is None:
        return "-"
    return f"{gap * 100:+.1f} %" + (" (consistent)" if gap >= 0 else "")


def _why(row: OomRow) -> str:
    if row.entry.reason:
        fill = {
            "ours": _gib(row.ours),
            "needed": _gib(row.needed),
            "peak": _gib(row.peak),
            "capacity": _gib(row.capacity),
        }
        return row.entry.reason.format(**fill)
    if row.weights > row.capacity:
        return f"the weights alone ({_gib(row.weights)} per GPU) exceed the GPU"
    return "largest: " + ", ".join(f"{label} {_gib(b)}" for label, b in row.parts) if row.predicted else ""


def ooms_summary(rows: list[OomRow]) -> str:
    """The summary line: how many failures gpumem predicts, and how far below the run it ever is."""
    predicted = [r for r in rows if r.predicted]
    by_weights = sum(1 for r in predicted if r.weights > r.capacity)
    under = [r.gap for r in rows if r.gap is not None and r.gap < 0]
    tail = (
        f"below what the run provably needed on {len(under)} (worst {min(under) * 100:+.1f} %)"
        if under
        else "never below what the run provably needed"
    )
    return (
        f"- **published OOM reports** ({len(rows)} with their setup): gpumem predicts {len(predicted)} "
        f"of the {len(rows)} failures ({by_weights} by the weights alone); {tail}"
    )


def render_ooms(rows: list[OomRow], add: Any) -> None:
    add("## (j) Published CUDA out-of-memory reports")
    add("")
    add(INTRO)
    add("")
    add(ooms_summary(rows).removeprefix("- "))
    add("")
    add(HEAD)
    add("|---|---|---:|---:|---|---:|---|")
    for r in rows:
        verdict = "yes" if r.predicted else "**no**"
        if r.predicted and r.fits:
            verdict += " (total above capacity; the verdict says fits)"
        add(
            f"| [{r.entry.id}]({r.entry.url}) | {_said(r)} | {_gib(r.needed)} | {_gib(r.ours)} | {verdict} "
            f"| {_vs(r)} | {_why(r)} |"
        )
    add("")
    add("| report | the setup as published | gpumem command | assumed |")
    add("|---|---|---|---|")
    for r in rows:
        e = r.entry
        add(f"| {e.id} ({e.published}) | {_cell(e.setup_quote)} | `{e.command}` | {_cell(e.assumptions)} |")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
