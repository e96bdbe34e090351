"""``gpumem calibrate`` (a measurement becomes a named calibration for its GPU), ``gpumem calibrations``
(list, ``--remove``), and the calibration that ``estimate`` / ``fit`` / ``sweep`` apply to their GPU target.

The calibrations live in one file shared with the window (:mod:`gpumem_gui.calibration_store`); what a
calibration measures and how it changes an estimate is the core's (:mod:`gpumem_gui.core.observed`)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, date, datetime
from typing import Any

from gpumem_gui.calibration_store import CalibrationStore
from gpumem_gui.cli.diagnose import read_text
from gpumem_gui.cli.flags import add_run_flags, bounded_int, loaded_spec, run_fields_given, run_from_args
from gpumem_gui.cli.output import dump, gib, print_table
from gpumem_gui.core import (
    REPLACED_BY,
    GpumemInputError,
    GpuTarget,
    Stack,
    apply_calibration,
    calibration_applies,
    calibration_for,
    calibration_from,
    calibration_note,
    estimate_any,
    short,
    with_target_arch,
)

SCHEMA = "gpumem.calibrations/1"
_STACK = ("torch", "driver", "cuda", "framework")


def add_calibrate_parsers(sub: Any) -> None:
    sp = sub.add_parser(
        "calibrate",
        help="save what a measurement (an OOM message, nvidia-smi, memory_summary) implies for its GPU",
    )
    add_run_flags(sp)
    for action in sp._actions:
        if action.dest == "model":
            action.nargs, action.default = "?", None
            action.help = (
                "the run measured (optional: with it, a stated peak reserved is set against its estimate)"
            )
    g = sp.add_argument_group("the measurement")
    g.add_argument(
        "--observed", required=True, metavar="FILE|-", help="the pasted report: a file, or - for stdin"
    )
    g.add_argument("--name", required=True, help="the calibration's name (1 to 60 characters)")
    g.add_argument(
        "--gpu", metavar="NAME", help="the GPU, where the text does not name it (catalog id or NVML name)"
    )
    g.add_argument("--gpu-index", type=bounded_int(0, 1023), metavar="N", help="which GPU of the text")
    g.add_argument(
        "--measured-on", metavar="YYYY-MM-DD", help="the day it was measured (default: today, UTC)"
    )
    for key in _STACK:  # --stack-*: --framework is a training run flag already
        g.add_argument(
            f"--stack-{key}", default="", metavar="TEXT", help=f"the {key} version it ran with (free text)"
        )
    g.add_argument("--stack-note", default="", metavar="TEXT", help="anything else about the software stack")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_calibrate)

    sp = sub.add_parser("calibrations", help="the saved calibrations (--remove NAME removes one)")
    sp.add_argument("--remove", metavar="NAME", help="remove the calibration NAME")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_calibrations)


def _measured_on(text: str | None) -> date:
    if text is None:
        return datetime.now(UTC).date()
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise GpumemInputError(f"a date as YYYY-MM-DD, got {short(text)}", field="measured-on") from None


def _run_estimate(args: argparse.Namespace) -> tuple[Any, str, str]:
    """The estimate of the run named (None without a model), its engine and its mode."""
    if not args.model:
        engine = str(run_fields_given(args).get("engine", "transformers"))
        return None, engine if args.mode == "inference" else "transformers", args.mode
    m = loaded_spec(args.model, args)
    run = with_target_arch(run_from_args(args, m), args.gpu)  # sized for the GPU measured on
    est = estimate_any(m.spec, run, None, m.weights)
    if not calibration_applies(est):
        raise GpumemInputError(
            f"the {est.engine} estimate has none of the components a calibration replaces "
            f"({', '.join(REPLACED_BY)}); nothing to calibrate",
            field="engine",
        )
    return est, est.engine, est.mode


def cmd_calibrate(args: argparse.Namespace) -> int:
    report = read_text(args.observed)  # the same reading as gpumem diagnose --observed
    est, engine, mode = _run_estimate(args)
    stack = Stack(**{k: getattr(args, f"stack_{k}") for k in _STACK}, note=args.stack_note)
    cal = calibration_from(
        report.records,
        est,
        name=args.name,
        gpu_name=args.gpu,
        gpu_index=args.gpu_index,
        engine=engine,
        mode=mode,
        stack=stack,
        measured_on=_measured_on(args.measured_on),
    )
    store = CalibrationStore()
    before = store.save(cal)
    if before.problem:
        print(f"gpumem: warning: {before.problem}", file=sys.stderr)
    if args.json:
        dump({"schema": SCHEMA, "store": str(store.path), "calibrations": [cal.model_dump(mode="json")]})
        return 0
    print(f"saved calibration '{cal.name}' for {cal.gpu_name} ({engine}, {mode}) in {store.path}")
    if cal.non_torch_bytes is not None:
        print(f"  non-PyTorch memory: {gib(cal.non_torch_bytes)} GiB  ({cal.non_torch_formula})")
    else:
        print(
            "  non-PyTorch memory: not measured (the text states no process memory beside PyTorch's reserved)"
        )
    if cal.allocator_ratio is not None:
        print(f"  allocator: reserved / allocated = {cal.allocator_ratio:.4f}  ({cal.allocator_formula})")
    else:
        print("  allocator: not measured (the text states no allocated and reserved pair)")
    if est is not None:  # the run measured, as the calibration changes it
        after = apply_calibration(est, cal).total_bytes
        print(
            f"  this run: {gib(est.total_bytes)} GiB per GPU with the defaults, {gib(after)} GiB calibrated"
        )
    print(f"  applies to later estimates on {cal.gpu_name} (--gpu / --local); gpumem calibrations lists them")
    return 0


def cmd_calibrations(args: argparse.Namespace) -> int:
    store = CalibrationStore()
    if args.remove is not None:
        gone = store.remove(args.remove)
        print(f"removed calibration '{gone.name}' ({gone.gpu_name}) from {store.path}")
        return 0
    loaded = store.load()
    if loaded.problem:
        print(f"gpumem: warning: {loaded.problem}", file=sys.stderr)
    cals = loaded.calibrations
    if args.json:
        dump(
            {
                "schema": SCHEMA,
                "store": str(store.path),
                "calibrations": [c.model_dump(mode="json") for c in cals],
            }
        )
        return 0
    if not cals:
        print(f"no calibrations in {store.path} (gpumem calibrate saves one)")
        return 0
    rows = [
        [
            c.name,
            c.gpu_name,
            f"{c.engine or 'any'}, {c.mode or 'any'}",
            gib(c.non_torch_bytes) if c.non_torch_bytes is not None else "-",
            f"{c.allocator_ratio:.4f}" if c.allocator_ratio is not None else "-",
            str(c.measurement.measured_on),
            ", ".join(c.measurement.source_formats),
        ]
        for c in cals
    ]
    print_table(
        rows,
        ["name", "GPU", "engine, mode", "non-PyTorch GiB", "reserved/allocated", "measured", "from"],
        {3, 4},
    )
    print(f"({store.path})")
    return 0


def saved_calibrations(args: argparse.Namespace) -> tuple[Any, ...]:
    """The saved calibrations (none with ``--no-calibration``). A store that cannot be read is one warning
    line; the estimate goes on without it."""
    if getattr(args, "no_calibration", False):
        return ()
    loaded = CalibrationStore().load()
    if loaded.problem:
        print(f"gpumem: warning: {loaded.problem}", file=sys.stderr)
    return loaded.calibrations


def calibrated_target(
    target: GpuTarget | None, run: Any, args: argparse.Namespace
) -> tuple[GpuTarget | None, str | None]:
    """``target`` with the saved calibration for its GPU and the run's engine and mode, and the note to print
    (None: no target, ``--no-calibration``, or none saved for it)."""
    if target is None:
        return target, None
    cal = calibration_for(saved_calibrations(args), target.name, run)
    if cal is None:
        return target, None
    return target.model_copy(update={"calibration": cal}), calibration_note(cal)
