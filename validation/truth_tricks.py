"""Ground truth for the framework memory tricks torch runs by itself, traced on one (fake) GPU.

For two small models and each trick (torchtune's chunked losses, optimizer in backward, activation
offloading with and without checkpointing, checkpointing every second layer, torchtitan's op-level
selective checkpointing), the trace worker (``gpumem_trace_worker.training``, the product's own request
path: :func:`gpumem_gui.trace.request.make_request`) measures one steady-state step with PyTorch's
MemTracker, and the estimate of the same run is put beside it. Written to
``tests/reference/distributed/tricks.json``; ``tests/test_truth_tricks.py`` checks the estimate against it
(goal: every phase peak within 3 %). Fused linear cross-entropy (Liger) and float8 need Triton / a GPU and
are modelled only; compile is checked against Inductor on the CPU by validation/truth_compile.py.

Run: ``.venv/bin/python validation/truth_tricks.py`` (about 5 minutes on a CPU).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpumem_gui.core import load_model, make_training_run  # noqa: E402
from gpumem_gui.core.training.rank import simulate_rank  # noqa: E402
from gpumem_gui.trace.request import make_request  # noqa: E402

OUT = REPO / "tests" / "reference" / "distributed" / "tricks.json"
MODELS = ("Qwen__Qwen2.5-0.5B", "meta-llama__Llama-3.2-1B")
_LORA = {"method": "lora", "batch": 2, "seq": 512}
CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("baseline: LoRA, no trick", dict(_LORA)),
    ("baseline: LoRA with checkpointing, no trick", {**_LORA, "grad_ckpt": True}),
    ("chunked CE (CEWithChunkedOutputLoss)", {**_LORA, "loss": "chunked", "loss_chunks": 8}),
    ("torchtune default loss (LinearCrossEntropyLoss)", {**_LORA, "framework": "torchtune"}),
    ("optimizer in backward", {"batch": 1, "seq": 512, "optimizer_in_backward": True}),
    ("activation offload", {**_LORA, "activation_offload": True}),
    ("activation offload + checkpointing", {**_LORA, "activation_offload": True, "grad_ckpt": True}),
    ("checkpoint every 2nd layer", {**_LORA, "grad_ckpt": True, "ckpt_every": 2}),
    ("op-level selective checkpointing", {**_LORA, "grad_ckpt": True, "ckpt_policy": "selective-op"}),
)
PHASES = ("forward", "backward", "optimizer")


def _model(model_name: str) -> Any:
    return load_model(str(REPO / "tests" / "reference" / "configs" / f"{model_name}.json"))


def estimate(model_name: str, fields: dict[str, Any]) -> tuple[dict[str, int], int]:
    """The estimate of a case: its phase peaks (the replay with the CPU's dropout kernel, as the trace ran on
    the CPU) and the host RAM of the offloaded activations (``validate.py`` section (g) reads it too)."""
    est, _, _ = simulate_rank(_model(model_name).spec, make_training_run(**fields), 0, cpu_dropout=True)
    return {ph: est.phases[ph].total for ph in PHASES if ph in est.phases}, est.host_bytes


def measure(model_name: str, label: str, fields: dict[str, Any]) -> dict[str, Any]:
    from gpumem_gui.trace.runner import run_in_process

    request = make_request(_model(model_name), make_training_run(**fields))
    t0 = time.perf_counter()
    traced = run_in_process(request)  # the product's in-process path (the model code's warnings ignored)
    seconds = round(time.perf_counter() - t0, 1)
    phases, host = estimate(model_name, fields)
    return {
        "model": model_name,
        "case": label,
        "run": fields,
        "traced": {ph: int(traced["phases"][ph]["Total"]) for ph in PHASES if ph in traced["phases"]},
        "estimated": phases,
        "traced_host_bytes": int(traced.get("host_bytes", 0)),
        "estimated_host_bytes": host,
        "seconds": seconds,
    }


def main() -> int:
    points = []
    for model_name in MODELS:
        for label, fields in CASES:
            p = measure(model_name, label, fields)
            errs = {ph: (p["estimated"][ph] - t) / t for ph, t in p["traced"].items()}
            p["relative_error"] = {ph: round(e, 6) for ph, e in errs.items()}
            points.append(p)
            print(
                f"{model_name} {label}: "
                + ", ".join(f"{ph} {e * 100:+.3f} %" for ph, e in errs.items())
                + f" host {p['traced_host_bytes']} / {p['estimated_host_bytes']} ({p['seconds']} s)",
                file=sys.stderr,
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "about": "framework tricks traced with PyTorch's MemTracker on fake tensors "
        "(validation/truth_tricks.py)",
        "goal": 0.03,
        "points": points,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    worst = max(abs(e) for p in points for e in p["relative_error"].values())
    print(f"{len(points)} points, worst phase error {worst * 100:.3f} % -> {OUT}", file=sys.stderr)
    return 0 if worst <= doc["goal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
