"""``gpumem trace``: the run traced by PyTorch itself, beside the analytic estimate."""

from __future__ import annotations

import argparse
from typing import Any

from gpumem_gui.cli.flags import add_run_flags, loaded_spec_or_config, run_from_args
from gpumem_gui.cli.output import dump, gib, print_table
from gpumem_gui.core import CATEGORIES, GpumemInputError
from gpumem_gui.trace import DEFAULT_TIMEOUT_S, NO_ESTIMATE_NOTE, trace, trace_document


def add_trace_flags(sp: argparse.ArgumentParser) -> None:
    add_run_flags(sp)
    sp.add_argument(
        "--python",
        metavar="PATH",
        help="the Python of an environment with torch and transformers (default: this one, when it has them)",
    )
    sp.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"stop the trace after this many seconds ({DEFAULT_TIMEOUT_S})",
    )
    sp.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run a config's own model code (only if you trust it)",
    )
    sp.add_argument("--no-cache", action="store_true", help="trace again even when a cached result exists")
    sp.add_argument("--json", action="store_true", help="machine-readable output (gpumem.estimate/1)")


def cmd_trace(args: argparse.Namespace) -> int:
    if not 1 <= args.timeout <= 86_400:
        raise GpumemInputError("must be between 1 and 86400 seconds", field="timeout")
    m = loaded_spec_or_config(args.model, args)
    run = run_from_args(args, m)
    rep = trace(m, run, args.python, args.timeout, args.trust_remote_code, use_cache=not args.no_cache)
    if args.json:
        dump(trace_document(m, run, rep))
    else:
        _print(m, rep)
    return 0


def _print(m: Any, rep: Any) -> None:
    r = rep.result
    print(f"{m.name}: traced by PyTorch {r.how} ({r.environment})")
    rows = [
        [
            p.phase,
            gib(p.traced_bytes),
            gib(p.estimated_bytes) if p.estimated_bytes is not None else "-",
            p.difference_text,
        ]
        for p in rep.phases
    ]
    print_table(rows, ["phase", "traced GiB", "estimated GiB", "estimate vs trace"], right={1, 2, 3})
    print()
    peak = rep.peak
    rows = [
        [c, f"{peak.traced[c]:,}", f"{peak.estimated[c]:,}" if peak.estimated else "-"]
        for c in CATEGORIES
        if peak.traced[c] or (peak.estimated and peak.estimated[c])
    ]
    print_table(rows, [f"at the peak ({r.peak_phase})", "traced bytes", "estimated bytes"], right={1, 2})
    if r.kv_cache_bytes is not None:
        est_kv = rep.estimate.kv_cache_bytes if rep.estimate is not None else None
        print(
            f"\nKV cache: {r.kv_cache_bytes:,} bytes traced"
            + (f", {est_kv:,} estimated" if est_kv is not None else "")
        )
    if rep.estimate is None:
        print(f"\n{NO_ESTIMATE_NOTE}")
    for n in rep.notes:
        print(f"note: {n}")
