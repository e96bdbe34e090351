"""Compare a ``validation/gpu_check.py`` run on a real GPU with gpumem's estimates.

Usage: ``.venv/bin/python validation/gpu_compare.py gpu_check.json [--out FILE]`` prints (or writes) the
table; keep the JSON in ``validation/gpu_results/`` and ``make validate`` adds the same table to
``docs/validation.md`` (section (e)).

Which of our numbers stands for each measurement (as for the published training points):

* ``torch.cuda.max_memory_allocated`` ↔ ``peak_bytes`` (live tensors at the peak);
* ``torch.cuda.max_memory_reserved`` ↔ ``reserved_prediction`` (core/results/reported.py: training runs with
  the caching allocator model on, its reserved peak + the cuBLAS workspaces; inference ``total_bytes −
  cuda_context − nccl_buffers``, the allocator holds the workspaces too, never the context or NCCL's
  buffers);
* NVML used memory of the device ↔ ``nvidia_smi_prediction`` (reserved + context + NCCL buffers);
* the CUDA context (NVML used after ``torch.zeros(1, device="cuda")`` minus before) ↔ our ``cuda_context``
  term; reserved − allocated ↔ our ``workspace + allocator_reserve``. These two rows are the calibration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpumem_gui.core.readers.hf_config import load_config_file  # noqa: E402
from gpumem_gui.core.reference_points import training_run_for_point  # noqa: E402
from gpumem_gui.core.results.estimate import Estimate  # noqa: E402
from gpumem_gui.core.results.nontorch import arch_of  # noqa: E402
from gpumem_gui.core.results.reported import nvidia_smi_prediction, reserved_prediction  # noqa: E402
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run  # noqa: E402
from gpumem_gui.core.training import estimate_training  # noqa: E402
from gpumem_gui.core.units import GiB, MiB  # noqa: E402

CONFIGS = REPO / "tests" / "reference" / "configs"
RESULTS = Path(__file__).resolve().parent / "gpu_results"


def estimate_point(p: dict, configs: Path = CONFIGS, gpu_arch: str = "auto") -> Estimate:
    """Our estimate for one ``gpu_check.py`` point (its setups mirror the reference grid's modes), sized for
    the measured GPU's generation ``gpu_arch``."""
    spec = load_config_file(configs / f"{p['config']}.json")
    if p["mode"].startswith(("train", "lora")):
        run = training_run_for_point({**p, "attn_implementation": "sdpa"})
        return estimate_training(spec, run.model_copy(update={"gpu_arch": gpu_arch, "allocator_model": True}))
    run = make_run(
        batch=p["batch"],
        seq=p["seq"],
        new_tokens=p.get("new_tokens", 0),
        logits=p.get("logits", "last"),
        attn="sdpa",
        gpu_arch=gpu_arch,
    )
    return estimate_inference(spec, run)


def doc_arch(doc: dict) -> str:
    """The measured GPU's generation from the compute capability gpu_check.py records (auto: not recorded,
    as in results made before it recorded one)."""
    cc = doc.get("compute_capability")
    return (arch_of(cc) or "auto") if cc else "auto"


def _err(ours: int, real: int | None) -> float | None:
    return (ours - real) / real if real else None


def rows(doc: dict, configs: Path = CONFIGS) -> list[dict]:
    """One dict per measured point: measured and ours for allocated, reserved and NVML used."""
    out = []
    for p in doc["points"]:
        setup = f"{p['config']} {p['mode']} b{p['batch']} s{p['seq']}"
        if p.get("new_tokens"):
            setup += f" +{p['new_tokens']} tokens"
        if "error" in p:
            out.append({"setup": setup, "error": p["error"]})
            continue
        est = estimate_point(p, configs, doc_arch(doc))
        ctx = est.component("cuda_context")
        ctx_bytes = ctx.bytes if ctx else 0
        reserved_ours, smi_ours = reserved_prediction(est), nvidia_smi_prediction(est)
        out.append(
            {
                "setup": setup,
                "allocated": p["allocated"],
                "peak": est.peak_bytes,
                "allocated_err": _err(est.peak_bytes, p["allocated"]),
                "reserved": p["reserved"],
                "reserved_ours": reserved_ours,
                "reserved_err": _err(reserved_ours, p["reserved"]),
                "nvml_used": p.get("nvml_used"),
                "total": smi_ours,
                "nvml_err": _err(smi_ours, p.get("nvml_used")),
                "slack_measured": p["reserved"] - p["allocated"],
                "slack_ours": reserved_ours - est.peak_bytes,
                "context_ours": ctx_bytes,
            }
        )
    return out


def _pct(e: float | None) -> str:
    return f"{e * 100:+.1f} %" if e is not None else "-"


def _gib(b: int | None) -> str:
    return f"{b / GiB:.2f}" if b is not None else "-"


def render(doc: dict, configs: Path = CONFIGS, title_level: str = "###") -> list[str]:
    rs = rows(doc, configs)
    ok = [r for r in rs if "error" not in r]
    L = [
        f"{title_level} {doc.get('gpu', 'unknown GPU')} (torch {doc['versions']['torch']}, "
        f"transformers {doc['versions']['transformers']})",
        "",
        "| setup | allocated | ours peak | err | reserved | ours reserved | err | "
        "NVML used | ours nvidia-smi | err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        if "error" in r:
            L.append(f"| {r['setup']} | failed: {r['error']} | | | | | | | | |")
            continue
        L.append(
            f"| {r['setup']} | {_gib(r['allocated'])} | {_gib(r['peak'])} | {_pct(r['allocated_err'])} | "
            f"{_gib(r['reserved'])} | {_gib(r['reserved_ours'])} | {_pct(r['reserved_err'])} | "
            f"{_gib(r['nvml_used'])} | {_gib(r['total'])} | {_pct(r['nvml_err'])} |"
        )
    L.append("")
    L.append("GiB (2^30 bytes).")
    if ok:
        ctx_ours = ok[0]["context_ours"]
        measured_ctx = doc.get("context_bytes")
        slack = [(r["slack_measured"], r["slack_ours"]) for r in ok]
        L += [
            "",
            "Calibration:",
            "",
            f"* CUDA context: measured {measured_ctx / MiB:.0f} MiB (NVML, after CUDA initialisation), ours "
            f"{ctx_ours / MiB:.0f} MiB."
            if measured_ctx is not None
            else "* CUDA context: not measured in this run.",
            "* reserved − allocated (cuBLAS workspace + allocator slack): measured median "
            f"{statistics.median(m for m, _ in slack) / MiB:.0f} MiB, ours median "
            f"{statistics.median(o for _, o in slack) / MiB:.0f} MiB.",
        ]
        for key, label in (
            ("allocated_err", "allocated"),
            ("reserved_err", "reserved"),
            ("nvml_err", "NVML"),
        ):
            errs = [abs(r[key]) for r in ok if r[key] is not None]
            if errs:
                L.append(
                    f"* {label}: median |error| {statistics.median(errs) * 100:.1f} %, worst "
                    f"{max(errs) * 100:.1f} % ({len(errs)} points)."
                )
    return L


def result_files(folder: Path = RESULTS) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--configs", type=Path, default=CONFIGS)
    ap.add_argument("--out", type=Path, help="write the Markdown here (default: print it)")
    args = ap.parse_args(argv)
    text = "\n".join(render(json.loads(args.result.read_text()), args.configs)) + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
