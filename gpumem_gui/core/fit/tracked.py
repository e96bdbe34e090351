"""The estimate as PyTorch's trackers report memory: per phase, by category, to put beside a trace.

``MemTracker`` (``torch/distributed/_tools/mem_tracker.py`` ``_MemRefType``) counts Parameter, Buffer,
Gradient, Activation, Temp, Optstate and Other (inputs); ``FSDPMemTracker`` (``fsdp2_mem_tracker.py``
``_FSDPRefType``) splits parameters and gradients into sharded / unsharded and adds the all-gather and
reduce-scatter buffers. Both are folded into five categories that the replay's kinds map onto one to one.
"""

from __future__ import annotations

from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.rank import simulate
from gpumem_gui.core.training.run import TrainingRun

CATEGORIES = ("parameters", "gradients", "optimizer states", "activations", "temporaries")

# tracker category name -> one of CATEGORIES
TRACKER_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "All Gather": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Reduce Scatter": "gradients",
    "Optstate": "optimizer states",  # MemTracker's spelling
    "OptState": "optimizer states",  # FSDPMemTracker's
    "Activation": "activations",
    "Other": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
}
# the replay's storage kinds (gpumem_gui.core.replay.memory.KINDS) -> one of CATEGORIES
_KIND_CATEGORIES = {
    "param": "parameters",
    "buffer": "parameters",
    "grad": "gradients",
    "optstate": "optimizer states",
    "act": "activations",
    "input": "activations",
    "temp": "temporaries",
}


def fold(counts: dict[str, int], table: dict[str, str]) -> dict[str, int]:
    """``counts`` by category name, summed into :data:`CATEGORIES` (Total left out); a name the table does
    not know (a newer tracker's) counts as activations, as MemTracker's "Other", so the sum stays the
    total."""
    out = dict.fromkeys(CATEGORIES, 0)
    for name, n in counts.items():
        if name != "Total":
            out[table.get(name, "activations")] += int(n)
    return out


def traced_categories(snapshot: dict[str, int]) -> dict[str, int]:
    """A tracker snapshot (``{"Parameter": ..., "Activation": ..., "Total": ...}``) in :data:`CATEGORIES`."""
    return fold(snapshot, TRACKER_CATEGORIES)


def tracked_breakdown(
    spec: ModelSpec, run: InferenceRun | TrainingRun, est: Estimate
) -> dict[str, dict[str, int]]:
    """What the analytic replay says each phase's peak holds, in :data:`CATEGORIES`, for the GPU (training:
    rank 0 of pipeline stage 0) a trace measures."""
    if isinstance(run, TrainingRun):
        res, _, _ = simulate(spec, run, 0)
        return {name: fold(peak.by_kind, _KIND_CATEGORIES) for name, peak in res.phases.items()}
    out = {}
    for name, phase in est.phases.items():
        # the weights component holds the parameters and the model's buffers; everything else of an
        # inference forward (KV cache, logits, temporaries, input ids) is what MemTracker calls activations
        weights = sum(c.bytes for c in phase.components if c.key == "weights")
        out[name] = {
            **dict.fromkeys(CATEGORIES, 0),
            "parameters": weights,
            "activations": phase.peak_bytes - weights,
        }
    return out
