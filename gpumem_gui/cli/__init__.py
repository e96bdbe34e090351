"""``gpumem``: the command-line interface over the same core as the window.

Every command has ``--json`` (stable keys, documented in README.md). Bad input prints one line
``gpumem: error: ...`` naming the file or field, and exits with status 2; never a traceback. The run flags
are generated from the run models (:mod:`gpumem_gui.cli.flags`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import ValidationError

from gpumem_gui import __version__
from gpumem_gui.cli.calibrate import add_calibrate_parsers
from gpumem_gui.cli.cluster import add_prometheus_flags
from gpumem_gui.cli.diagnose import add_diagnose_parser
from gpumem_gui.cli.flags import (
    MODES,
    add_inspect_flags,
    add_run_flags,
    add_target_flags,
    bounded_int,
    run_from_args,
)
from gpumem_gui.cli.imports import add_import_flags
from gpumem_gui.cli.info import cmd_formats, cmd_gpus, cmd_inspect, cmd_models, inspect_json
from gpumem_gui.cli.output import ECHO_CHARS, clip
from gpumem_gui.cli.plan import cmd_estimate, cmd_fit, cmd_sweep, estimate_json
from gpumem_gui.cli.trace_cmd import add_trace_flags, cmd_trace
from gpumem_gui.core import MAX_SWEEP_POINTS, GpumemError, describe_validation_error, run_fields

__all__ = ["build_parser", "estimate_json", "inspect_json", "main", "run_from_args"]

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage of ``estimate`` alone is 40 lines), as every other input
    error reads: ``gpumem: error: <command>: <flag>: <problem> (see gpumem <command> --help)``, exit
    status 2; a long value argparse repeats is cut short."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("gpumem").strip() or "command line"
        text = re.sub(r"^argument ([^:]+): ", r"\1: ", message)
        text = re.sub(rf"'([^']{{{ECHO_CHARS + 1},}})'", lambda m: clip(m.group(1)), text)
        text = " ".join(text.split())
        self.exit(EXIT_BAD_INPUT, f"gpumem: error: {where}: {text} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpumem",
        description="Will this model, in this setup, fit on my GPUs? What is eating the memory?",
    )
    p.add_argument("--version", action="version", version=f"gpumem {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    sp = sub.add_parser("models", help="list the built-in model catalog")
    sp.add_argument("--search", metavar="TEXT", help="only models whose id, family or size contains TEXT")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_models)

    sp = sub.add_parser(
        "gpus",
        help="the local GPUs through NVML, a cluster's through Prometheus (--prometheus), or the catalog",
    )
    sp.add_argument("--catalog", action="store_true", help="the built-in accelerator catalog")
    sp.add_argument(
        "--fake-gpus",
        metavar="FILE",
        help="read a fake-GPU scenario (JSON file, or a shipped name such as a100_mig) instead of NVML",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    add_prometheus_flags(sp, fit=False)
    sp.set_defaults(func=cmd_gpus)

    sp = sub.add_parser("inspect", help="architecture, exact parameters, weight bytes and KV cost of a model")
    sp.add_argument(
        "model",
        help="catalog id, config.json, model folder, .safetensors, .gguf, or Hugging Face hub id (org/name)",
    )
    add_inspect_flags(sp)
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("estimate", help="memory of a run: components, phases, per GPU, with explanations")
    add_run_flags(sp)
    add_target_flags(sp)
    sp.set_defaults(func=cmd_estimate)

    sp = sub.add_parser(
        "fit", help="does the run fit on --gpu, --local or a cluster (--prometheus); maxima; ranked changes"
    )
    add_run_flags(sp)
    add_target_flags(sp)
    add_prometheus_flags(sp, fit=True)
    sp.set_defaults(func=cmd_fit)

    _add_sweep_parser(sub)

    sp = sub.add_parser(
        "trace",
        help="the run traced by PyTorch itself (the real model under fake tensors), beside the estimate",
    )
    add_trace_flags(sp)
    sp.set_defaults(func=cmd_trace)

    add_diagnose_parser(sub)
    add_calibrate_parsers(sub)  # calibrate, calibrations (cli/calibrate.py)

    sp = sub.add_parser("formats", help="weight formats gpumem knows")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_formats)
    add_import_flags(sub.choices["estimate"], sub.choices["fit"])
    return p


def _add_sweep_parser(sub: Any) -> None:
    sp = sub.add_parser("sweep", help="estimates at evenly spaced batch sizes or sequence lengths")
    add_run_flags(sp)
    add_target_flags(sp)
    sp.add_argument("--over", choices=["seq", "batch"], required=True)
    # the ranges here only bound what is read; the run model's range for --over and the mode's cap on
    # points (core.MAX_SWEEP_POINTS) are checked once the mode is known
    big = max(f.hi or 0 for m in MODES.values() for f in run_fields(m) if f.name in ("seq", "batch"))
    sp.add_argument("--from", dest="start", type=bounded_int(1, int(big)), required=True, metavar="N")
    sp.add_argument("--to", dest="stop", type=bounded_int(1, int(big)), required=True, metavar="N")
    sp.add_argument(
        "--steps",
        type=bounded_int(1, max(MAX_SWEEP_POINTS.values())),
        default=16,
        help="points, evenly spaced (at most "
        + ", ".join(f"{n:,} for --mode {m}" for m, n in MAX_SWEEP_POINTS.items())
        + "; default 16)",
    )
    sp.add_argument("--csv", action="store_true", help="CSV output")
    sp.set_defaults(func=cmd_sweep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a flag argparse rejected (one line, status 2)
        return int(e.code or 0)
    try:
        return int(args.func(args))
    except GpumemError as e:
        return _fail(str(e))
    except ValidationError as e:  # a model the core built without naming the field (still one line)
        return _fail(str(describe_validation_error(e)))
    except BrokenPipeError:  # `gpumem models | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C, e.g. during a long sweep: no traceback
        print("\ngpumem: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _fail(message: str) -> int:
    print("gpumem: error: " + re.sub(r"\s*\n\s*", " ", message.strip()), file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
