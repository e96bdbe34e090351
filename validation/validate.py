"""Validation report: gpumem's inference and training estimates against measured and published numbers.

Run ``.venv/bin/python validation/validate.py [--out docs/validation.md] [--subset] [--refresh-peers]``
(``make validate`` writes ``docs/validation.md``).

* (a) every inference point of the PyTorch-measured grids (``groundtruth.json`` and
  ``tests/reference/extra/grid_infer.json``): our ``peak_bytes`` against the measured peak, our
  ``kv_cache_bytes`` against the measured DynamicCache;
* (b) every inference point of ``published/published.json`` we can reproduce, through the curated mapping
  of ``validation/data/published_inference.json`` (which model spec, which run, which of our numbers is the
  published one); the others are listed with the reason (``validation/data/not_reproduced.json``);
* (c) optional peers (llm-analysis, accelerate's meta-model size) on the grid points, read from
  ``validation/peers.json``, which ``--refresh-peers`` rebuilds in scratch virtual environments (never the
  project's).

* (d) every training point of both grids (``groundtruth.json`` and ``extra/grid_train.json``): the step's
  peak and each phase's peak (forward / backward / optimizer) against ours, and the published fine-tuning
  points we can reproduce, through ``validation/data/published_training.json`` (full fine-tune, LoRA,
  QLoRA; torchtune, torchtitan, fsdp_qlora, HF docs; two fits/OOM bounds and one largest-context bound).

* (e) real-GPU results (``validation/gpu_results/``) and (f) the points PyTorch traced
  (``tests/reference/trace``);
* (g) distributed and framework training per rank against PyTorch's trackers: every point of
  ``tests/reference/distributed/{fsdp,ddp,tp,tricks}.json`` (made by ``validation/truth_*.py``) with its
  estimate recomputed; (h) the per-framework figures of the published real-GPU training runs
  (``docs/validation-training.md``, read from ``validation/data/published_training_runs/result.json``).
* (i) the inference engines (vLLM, SGLang, llama.cpp, Ollama) against the published logs of
  ``validation/data/engine_logs/`` and section (b)'s lines of the same engines, per engine and TP degree
  (``validate_report/engine_logs.py`` is the comparison ``tests/test_*_logs.py`` also use).
* (j) published CUDA out-of-memory reports that state their setup (``validation/data/published_ooms.json``):
  whether ``gpumem fit`` predicts each failure and how far below what the run held it ever is
  (``--section ooms`` prints this section alone).

The output is deterministic: rows are sorted and nothing but the versions block depends on the machine.

This file is the entry point and the orchestration; each section is a module of ``validate_report/`` and
the data tables are JSON files in ``data/`` (checked by ``validate_report/data.py`` when read).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # validate_report/ and gpu_compare.py are imported from beside this file
    sys.path.insert(0, str(HERE))

from validate_report import data  # noqa: E402
from validate_report.common import (  # noqa: E402
    EXTRA,
    GT_VENV,
    PEERS_FILE,
    PEERS_VENV,
    REASON_THRESHOLD,
    REPO,
    GiB,
    MiB,
    Report,
    Row,
    config_path,
    reference_dir,
)
from validate_report.distributed import distributed_files, published_runs  # noqa: E402
from validate_report.engines import engine_section  # noqa: E402
from validate_report.grid import (  # noqa: E402
    grid_points,
    grid_rows,
    grid_setup,
    train_grid_points,
    train_grid_rows,
    train_grid_setup,
)
from validate_report.ours import OURS  # noqa: E402
from validate_report.peers import (  # noqa: E402
    LLM_ANALYSIS_TRAIN,
    accelerate_training_bytes,
    peer_rows,
    refresh_peers,
    train_peer_rows,
)
from validate_report.peers import llm_analysis_config as _llm_analysis_config  # noqa: E402
from validate_report.peers import run_peer as _run_peer  # noqa: E402
from validate_report.published import (  # noqa: E402
    NOT_REPRODUCED,
    PUBLISHED,
    published_leftovers,
    published_rows,
)
from validate_report.published import label as _label  # noqa: E402
from validate_report.published import parse_value as _parse_value  # noqa: E402
from validate_report.published_ooms import SUBSET as OOM_SUBSET  # noqa: E402
from validate_report.published_ooms import published_oom_rows, render_ooms  # noqa: E402
from validate_report.published_training import (  # noqa: E402
    PUBLISHED_TRAINING,
    TRAIN_OURS,
    published_training_rows,
)
from validate_report.render import render  # noqa: E402
from validate_report.render import render_real_gpu as _render_real_gpu  # noqa: E402

# what tests/test_validation_script.py, benchmarks/peers_speed.py and validation/regression.py use from here
__all__ = [
    "EXTRA",
    "GT_VENV",
    "LLM_ANALYSIS_TRAIN",
    "NOT_REPRODUCED",
    "OURS",
    "PEERS_FILE",
    "PEERS_VENV",
    "PUBLISHED",
    "PUBLISHED_TRAINING",
    "REASON_THRESHOLD",
    "REPO",
    "TRAIN_OURS",
    "GiB",
    "MiB",
    "Report",
    "Row",
    "_label",
    "_llm_analysis_config",
    "_parse_value",
    "_render_real_gpu",
    "_run_peer",
    "accelerate_training_bytes",
    "collect",
    "config_path",
    "distributed_files",
    "grid_points",
    "grid_rows",
    "grid_setup",
    "main",
    "peer_rows",
    "published_leftovers",
    "published_rows",
    "published_runs",
    "published_training_rows",
    "reference_dir",
    "refresh_peers",
    "render",
    "train_grid_points",
    "train_grid_rows",
    "train_grid_setup",
    "train_peer_rows",
]


def _ver(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def _versions(peers: dict | None) -> dict[str, str]:
    gt = json.loads((reference_dir() / "groundtruth.json").read_text())["versions"]
    out = {
        "gpumem": _ver("gpumem"),
        "python (this run)": platform.python_version(),
        "pydantic": _ver("pydantic"),
        "gguf": _ver("gguf"),
        "reference: torch / transformers": f"{gt.get('torch')} / {gt.get('transformers')}",
    }
    if peers:
        la, acc = peers.get("llm_analysis") or {}, peers.get("accelerate") or {}
        out["peer: llm-analysis"] = la.get("version", "not run")
        out["peer: accelerate / transformers"] = (
            f"{acc.get('version', 'not run')} / {acc.get('transformers', '-')}"
        )
    return out


def collect(subset: bool = False, peers: dict | None = None) -> Report:
    """Everything the report shows; ``subset``: a few grid points and three published points (tests)."""
    picks = data.grid().subset
    rep = Report()
    rep.grid = grid_rows(subset)
    entries = json.loads((reference_dir() / "published" / "published.json").read_text())
    rep.published, rep.mapping = published_rows(entries, picks.published if subset else None)
    rep.not_reproduced, leftover = published_leftovers(entries)
    rep.not_reproduced = sorted(
        [
            *rep.not_reproduced,
            *((pid, model, "training", f"not mapped yet ({what})") for pid, model, what in leftover),
        ]
    )
    rep.train, rep.train_phases = train_grid_rows(subset)
    rep.train_published, rep.train_mapping, rep.train_bounds = published_training_rows(
        entries, picks.published_training if subset else None
    )
    if not subset:
        rep.peers, rep.peers_note = peer_rows(rep.grid, peers)
        rep.train_peers = train_peer_rows(rep.train, peers)
    rep.ranks = distributed_files()
    rep.published_runs = published_runs()
    rep.engines = engine_section(rep.published, entries)
    rep.ooms = published_oom_rows(set(OOM_SUBSET) if subset else None)
    rep.versions = _versions(peers)
    return rep


def _ooms_alone() -> str:
    """Section (j) by itself (``--section ooms``): it needs none of the reference data the others read."""
    lines: list[str] = []
    render_ooms(published_oom_rows(), lines.append)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    ap.add_argument("--subset", action="store_true", help="a few grid points and three published points")
    ap.add_argument(
        "--refresh-peers",
        action="store_true",
        help=f"rerun llm-analysis ({PEERS_VENV}) and accelerate ({GT_VENV}) and rewrite {PEERS_FILE.name}",
    )
    ap.add_argument("--section", choices=["ooms"], help="only this section: (j) published OOM reports")
    args = ap.parse_args(argv)
    if args.section == "ooms":
        sys.stdout.write(_ooms_alone())
        return 0
    if args.refresh_peers:
        PEERS_FILE.write_text(json.dumps(refresh_peers(), indent=1, sort_keys=True) + "\n")
    peers = json.loads(PEERS_FILE.read_text()) if PEERS_FILE.is_file() else None
    text = render(collect(subset=args.subset, peers=peers))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
