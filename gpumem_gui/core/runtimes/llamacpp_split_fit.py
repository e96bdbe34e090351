"""llama.cpp's ``--fit`` over several GPUs for a dense model (common/fit.cpp ``common_params_fit_impl`` with
more than one device and ``-c`` given).

Step 1 projects llama.cpp's default layer split (``--tensor-split`` unset: by each device's free memory, equal
on equal GPUs) and changes nothing when every device keeps its target free ("targets for free memory can be
met on all devices"). Otherwise it fills the devices back to front: the last device gets the most of the
unassigned layers (the output layer among them) that keep its target free, then the one before it, and so on
(the method of false position over a monotone use, which ends where :func:`~gpumem_gui.core.monotone.largest`
does); the counts become ``--tensor-split`` and their sum ``-ngl``. A MoE model over several devices
(the experts' overflow to the next device, ``LAYER_FRACTION_*``) is not modelled: one line says so.
"""

from __future__ import annotations

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.monotone import largest
from gpumem_gui.core.runtimes.ollama_split import gpu_layers, gpu_share, head_bytes
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import MiB


def fit_split(
    spec: ModelSpec, run: InferenceRun, wb: WeightBytes, gpus: int, free: int, target_mib: int
) -> tuple[tuple[int, ...], int, str]:
    """(layer split, GPU layers counting the output layer, the fit's note) of ``run`` (a llama.cpp run) on
    ``gpus`` equal GPUs with ``free`` bytes free each and a target of ``target_mib`` MiB."""
    n = spec.num_layers
    total = n + 1
    head = head_bytes(spec, run, wb)
    target = free - target_mib * MiB

    def usage(split: tuple[int, ...], layers: int) -> list[int]:
        ranges = gpu_layers(split, n, layers)
        return [gpu_share(spec, run, wb, g, r, head, True).peak_bytes for g, r in enumerate(ranges)]

    even = (1,) * gpus
    if all(u <= target for u in usage(even, total)):
        return even, total, "--fit: the targets for free memory are met on every GPU, no changes needed"
    if spec.moe is not None:
        raise GpumemInputError(
            "llama.cpp --fit of a MoE model over several GPUs (routed experts overflowing to the next "
            "device, common/fit.cpp LAYER_FRACTION_*) is not modelled yet; use one GPU (pp 1) or set "
            "num_gpu / -ngl",
            field="pp",
        )
    counts = [0] * gpus
    for d in reversed(range(gpus)):
        left = total - sum(counts[d + 1 :])

        def fits(k: int, d: int = d) -> bool:
            trial = (*counts[:d], k, *counts[d + 1 :])
            return usage(trial, sum(trial))[d] <= target

        counts[d] = largest(fits, 0, left) or 0
    layers = sum(counts)
    note = (
        f"--fit: {layers} of {total} layers (the output layer counted) on the GPUs, split "
        f"{','.join(str(c) for c in counts)} back to front (--tensor-split)"
    )
    return tuple(counts), layers, note
