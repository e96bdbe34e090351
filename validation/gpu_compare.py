"""Compare a ``validation/gpu_check.py`` run with gpumem's estimates; writes ``docs/gpu_check.md``.

Usage: ``.venv/bin/python validation/gpu_compare.py gpu_check.json [--out docs/gpu_check.md]``.
Inference points compare ``max_memory_allocated`` with ``peak_bytes`` and NVML's used memory with
``total_bytes``; training points are listed with their measurements until gpumem estimates training.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpumem_gui.core.hf_config import load_config_file  # noqa: E402
from gpumem_gui.core.inference import estimate_inference, make_run  # noqa: E402
from gpumem_gui.core.units import GiB  # noqa: E402


def _pct(ours: int, real: int) -> str:
    return f"{100 * (ours - real) / real:+.1f} %" if real else "-"


def compare(doc: dict, configs: Path) -> str:
    lines = [
        "# gpumem against a real GPU",
        "",
        f"GPU: {doc.get('gpu', '?')}, torch {doc['versions']['torch']}, "
        f"transformers {doc['versions']['transformers']}. "
        f"CUDA context measured by NVML: {doc.get('context_bytes', 0) / GiB:.2f} GiB.",
        "",
        "| setup | allocated (GiB) | ours peak | err | NVML used (GiB) | ours total | err |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in doc["points"]:
        setup = f"{p['config']} {p['mode']} b{p['batch']} s{p['seq']}"
        if "error" in p:
            lines.append(f"| {setup} | failed: {p['error']} | | | | | |")
            continue
        if p["mode"] not in ("infer", "generate"):
            lines.append(
                f"| {setup} | {p['allocated'] / GiB:.2f} | (training: not estimated yet) | | "
                f"{(p['nvml_used'] or 0) / GiB:.2f} | | |"
            )
            continue
        spec = load_config_file(configs / f"{p['config']}.json")
        run = make_run(batch=p["batch"], seq=p["seq"], new_tokens=p.get("new_tokens", 0), logits=p["logits"])
        est = estimate_inference(spec, run)
        used = p["nvml_used"] or 0
        lines.append(
            f"| {setup} | {p['allocated'] / GiB:.2f} | {est.peak_bytes / GiB:.2f} "
            f"| {_pct(est.peak_bytes, p['allocated'])} "
            f"| {used / GiB:.2f} | {est.total_bytes / GiB:.2f} | {_pct(est.total_bytes, used)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--configs", type=Path, default=REPO / "tests" / "reference" / "configs")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "gpu_check.md")
    args = ap.parse_args(argv)
    args.out.write_text(compare(json.loads(args.result.read_text()), args.configs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
