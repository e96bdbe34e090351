"""The trace worker: builds the real transformers model under FakeTensorMode and lets PyTorch count.

This package runs inside the user's own ML environment (any Python with ``torch`` and ``transformers``;
``peft`` for LoRA), so it imports nothing from gpumem: gpumem runs it as ``python -m gpumem_trace_worker``
with this folder's parent on ``PYTHONPATH`` and speaks JSON over stdin/stdout (one request in, one result
out), or imports it when torch is importable in-process.

What it measures (``torch.distributed._tools.mem_tracker.MemTracker``, which counts the storage bytes of every
live tensor: parameters, buffers, gradients, optimizer states, activations, temporaries, inputs; per rank
``fsdp2_mem_tracker.FSDPMemTracker`` for FSDP2):

* ``inference`` (:mod:`.inference`): ``model.eval()``, ``torch.no_grad()``, weights in the compute dtype;
  ``load``, ``prefill`` (``logits_to_keep=1`` as ``generate()`` or all logits) and ``decode`` (the last step
  after a cache built as ``generate()`` builds it, while the previous step's fp32 scores are alive).
* ``train`` (:mod:`.training`): one optimizer step in steady state (states exist before it unless
  ``first_step``): forward + loss (``labels=input_ids``), backward, ``optimizer.step()``,
  ``zero_grad(set_to_none=True)``; HF-Trainer mixed precision (fp32 weights, ``torch.autocast``); LoRA through
  ``peft``; non-reentrant checkpointing; gradient accumulation (two micro-batches, the second with every
  ``.grad`` live). Per rank of a data-parallel job (:mod:`.distributed`): FSDP2 ``fully_shard``, DDP, DDP +
  ``ZeroRedundancyOptimizer`` (ZeRO-1), one process playing rank 0 under torch's fake process group.

What the real code does that fake tensors cannot is handled in :mod:`.building` and named in the result's
``notes``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .building import CODE_DIR, TraceError, quiet_transformers, versions

__all__ = ["SCHEMA", "TraceError", "handle", "versions"]

SCHEMA = "gpumem.trace-worker/1"


def handle(request: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """Run one request: ``{"config": {...}, "mode": "inference"|"train", "run": {...}}``.

    ``quiet``: transformers' own log lines (deprecations) stay off the terminal of an in-process caller; a
    subprocess keeps them in its log."""
    if quiet:
        with quiet_transformers():
            return handle(request)
    if not isinstance(request, dict) or not isinstance(request.get("config"), dict):
        raise TraceError("the request needs a 'config' object")
    mode = request.get("mode", "inference")
    if mode not in ("inference", "train"):
        raise TraceError(f"mode must be 'inference' or 'train', got {mode!r}")
    run = request.get("run") or {}
    if not isinstance(run, dict):
        raise TraceError("the request's 'run' must be an object")
    t0 = time.perf_counter()
    trust = bool(request.get("trust_remote_code"))
    code_dir = request.get("code_dir")
    token = CODE_DIR.set(code_dir if isinstance(code_dir, str) and os.path.isdir(code_dir) else None)
    try:
        if mode == "inference":
            from .inference import trace_inference

            res = trace_inference(request["config"], run, trust)
        else:
            from .training import trace_training

            res = trace_training(request["config"], run, trust)
    finally:
        CODE_DIR.reset(token)
    phases = res["phases"]
    peak_phase = max(phases, key=lambda k: phases[k].get("Total", 0))
    return {
        "schema": SCHEMA,
        "versions": versions(),
        "seconds": round(time.perf_counter() - t0, 3),
        "mode": mode,
        "peak_bytes": phases[peak_phase].get("Total", 0),
        "peak_phase": peak_phase,
        **res,
    }
