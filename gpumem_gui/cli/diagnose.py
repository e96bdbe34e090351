"""``gpumem diagnose [MODEL and the run flags] --observed FILE|-``: what a GPU said (an OOM message,
nvidia-smi, PyTorch's memory report, an engine's lines), explained in parts and, with a model, against the
run's estimate, with the changes that would have made it fit (``--json``: schema ``gpumem.diagnosis/1``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpumem_gui.cli.flags import add_run_flags, bounded_int, run_fields_given
from gpumem_gui.cli.imports import add_import_flags, imported, model_and_run, print_imported
from gpumem_gui.cli.output import dump, gib, print_table
from gpumem_gui.core import (
    OBSERVED_MAX_BYTES,
    Diagnosis,
    GpumemInputError,
    ObservedMemory,
    ObservedReport,
    diagnose,
    diagnosis_document,
    gpu_target_from_text,
    latest_record,
    read_observed_bytes,
    read_observed_file,
    short,
)

# --gpu-index: the bound of ObservedMemory.gpu_index (core/observed/model.py)
MAX_GPU_INDEX = 1023


def add_diagnose_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "diagnose",
        help="explain what the GPU said (an OOM message, nvidia-smi, memory_summary, engine lines) in "
        "parts, against a run's estimate when a MODEL is given, with the changes that would have made it fit",
    )
    add_run_flags(sp)
    sp.add_argument(
        "--observed",
        required=True,
        metavar="FILE|-",
        help="the text the GPU or PyTorch printed (a file, or - for standard input)",
    )
    sp.add_argument(
        "--gpu-index",
        type=bounded_int(0, MAX_GPU_INDEX),
        default=None,
        metavar="N",
        help="the GPU to diagnose when the text reports several (default: the only one)",
    )
    sp.add_argument(
        "--gpu",
        default=None,
        metavar="GPU[:COUNT]",
        help="the GPUs the run used, where the text states no total (a catalog GPU or a capacity, as for "
        "gpumem fit); COUNT for a run over several",
    )
    sp.add_argument(
        "--margin-mib",
        type=bounded_int(0, 1 << 20, " MiB"),
        default=0,
        help="memory kept free per GPU when judging the run (0 to 1,048,576 MiB; default 0: as it happened)",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output (gpumem.diagnosis/1)")
    add_import_flags(sp)
    for action in sp._actions:
        if action.dest == "model":
            action.help = (
                "the run's model (catalog id, config.json, folder, .safetensors, .gguf, hub id); without it "
                "(and without --from / --from-file) only the observed memory is explained"
            )
    sp.set_defaults(func=cmd_diagnose)


def read_text(path: str) -> ObservedReport:
    """The report in ``path`` (``-``: standard input), read at most to the readers' bound."""
    if path != "-":
        return read_observed_file(path)
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # started with standard input closed
        raise GpumemInputError("no standard input to read (give a file)", field="observed")
    try:
        return read_observed_bytes(stream.read(OBSERVED_MAX_BYTES + 1))
    except GpumemInputError as e:
        raise GpumemInputError(e.message, source="standard input") from None


def pick(report: ObservedReport, index: int | None) -> tuple[ObservedMemory, str]:
    """The record to diagnose, and a note when the text held more: ``--gpu-index`` picks the GPU; of a
    GPU's reports, the last failure (else the last report), the latest state a log shows."""
    records = list(report.records)
    gpus = sorted({r.gpu_index for r in records}, key=lambda i: -1 if i is None else i)
    if index is not None:
        records = [r for r in records if r.gpu_index == index]
        if not records:
            named = ", ".join(str(i) for i in gpus if i is not None)
            where = f"it reports GPU {named}" if named else "it names no GPU index; leave out --gpu-index"
            raise GpumemInputError(f"the text reports no GPU {index} ({where})", field="gpu-index")
    elif len(gpus) > 1:
        named = ", ".join("unnamed" if i is None else str(i) for i in gpus)
        raise GpumemInputError(
            f"the text reports {len(gpus)} GPUs ({named}): pick one with --gpu-index N", field="gpu-index"
        )
    chosen = records[latest_record(tuple(records))]
    note = ""
    if len(report.records) > 1:
        failure = chosen.requested_bytes is not None
        note = (
            f"{len(report.records)} reports in the text; this is the last {'failure' if failure else 'one'}"
        )
    return chosen, note


def cmd_diagnose(args: argparse.Namespace) -> int:
    report = read_text(args.observed)
    observed, note = pick(report, args.gpu_index)
    target = gpu_target_from_text(args.gpu) if args.gpu else None
    margin = args.margin_mib << 20
    if not args.model and imported(args) is None:
        given = run_fields_given(args)
        if given:
            flag = "--" + next(iter(given)).replace("_", "-")
            raise GpumemInputError(f"{flag} describes a run: name its MODEL too", field="model")
        d, model, run, imp = diagnose(observed, target=target, margin=margin), None, None, None
    else:
        m, run, imp = model_and_run(args)
        d = diagnose(observed, spec=m.spec, run=run, file_weights=m.weights, target=target, margin=margin)
        model = m.name
    if args.json:
        doc = diagnosis_document(d, model, run)
        if imp is not None:
            doc["imported"] = imp
        dump(doc)
        return 0
    print_imported(imp)
    print_diagnosis(d, model, note, report.unread)
    return 0


def _observed_head(o: ObservedMemory, note: str) -> str:
    gpu = "GPU ?" if o.gpu_index is None else f"GPU {o.gpu_index}"
    name = f" ({short(o.gpu_name, 60)})" if o.gpu_name else ""
    return f"observed: {o.source_format}, {gpu}{name}" + (f"; {note}" if note else "")


def print_diagnosis(d: Diagnosis, model: str | None, note: str = "", unread: tuple[str, ...] = ()) -> None:
    o = d.observed
    print(_observed_head(o, note))
    rows = [[p.label, "?" if p.bytes is None else gib(p.bytes), p.note] for p in d.parts]
    if o.total_bytes is not None:
        rows.append(["total (as the report states it)", gib(o.total_bytes), ""])
    if rows:
        print_table(rows, ["part", "GiB", "note"], right={1})
    if o.parts:
        print("the engine's lines (GiB): " + "   ".join(f"{k} {gib(v)}" for k, v in o.parts.items()))
    for proc in o.processes:  # the ones the report names (the reporting process is a part above)
        if proc.this_process and proc.pid is None:
            continue
        who = " (this process)" if proc.this_process else ""
        name = f" {short(proc.name, 60)}" if proc.name else ""
        print(f"process {proc.pid if proc.pid is not None else '?'}{name}: {gib(proc.bytes)} GiB{who}")
    for line in (*o.unread, *unread):
        print(f"not read: {line}")
    for line in d.causes.lines:
        print(f"- {line}")
    if d.estimate is not None:
        _print_estimate(d, model)
    elif d.no_prediction:
        print(f"no comparison with an estimate: {d.no_prediction} (name a MODEL and its run flags)")
    if d.changes:
        print()
        print("changes that would have made it fit (ranked):")
        for i, c in enumerate(d.changes, 1):
            size = "" if c.total_bytes is None else f": {gib(c.total_bytes)} GiB"
            mark = {True: " (fits)", False: " (does not fit)", None: ""}[c.fits]
            print(f"  {i}. {c.description}{size}{mark}")


def _print_estimate(d: Diagnosis, model: str | None) -> None:
    est = d.estimate
    assert est is not None
    print()
    print(f"estimate for {model}: {est.mode}, engine {est.engine}, peak in phase '{est.peak_phase}'")
    rows = [
        [
            c.label,
            gib(c.estimated_bytes),
            "?" if c.observed_bytes is None else gib(c.observed_bytes),
            "" if c.difference_bytes is None else gib(c.difference_bytes),
        ]
        for c in d.compared
        if c.observed_bytes is not None or c.key == "process"  # what the report does not state: --json has it
    ]
    print_table(rows, ["", "estimate GiB", "observed GiB", "observed - estimate GiB"], right={1, 2, 3})
    phases = "   ".join(f"{n} {gib(b)}" for n, b in d.phases.items())
    print(f"phases (GiB): {phases}")
    if d.phase_reached is not None:
        print(f"the observed tensors are first reached in the estimate's phase '{d.phase_reached}'")
    elif d.compared and d.compared[0].observed_bytes is not None:
        print("no phase of the estimate reaches the observed tensors: the estimate is below them")
    p = d.prediction
    if p is None:
        print(f"no verdict: {d.no_prediction}")
        return
    print(f"capacity: {gib(p.capacity_bytes)} GiB ({p.capacity_source})", end="")
    print(f", other processes {gib(p.other_processes_bytes)} GiB" if p.other_processes_bytes else "")
    print(p.summary)
