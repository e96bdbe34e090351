"""llama.cpp's ``--fit`` over several GPUs (common/fit.cpp ``common_params_fit_impl`` with more than one
device and ``-c`` given; read at ggml-org/llama.cpp commit 08033df0, the stored version of the file).

Step 1 projects llama.cpp's default layer split (``--tensor-split`` unset: by each device's free memory, equal
on equal GPUs) and changes nothing when every device keeps its target free ("targets for free memory can be
met on all devices"). Otherwise steps 3 and 4 (:func:`.llamacpp_fit_search.fit_devices`, the same search a
single GPU runs) place the layers; the routed experts left in host memory are multiplied on GPU 0 (op
offload), whose compute buffer holds one layer's copy. The counts become ``--tensor-split`` and their sum
``-ngl``; the dense-only layers become ``-ot`` overrides (:func:`.llamacpp_fit_search.override_blocks`), and
llama.cpp lays the ``-ngl`` layers out output layer first (``src/llama-model.cpp`` ``load_tensors``:
``i_gpu_start = n_layer + 1 - n_gpu_layers``; :func:`.ollama_split.gpu_layers` with ``output_first``). Not
modelled: the one extra layer step 4 then tries to split per device (``LAYER_FRACTION_UP`` / ``GATE`` /
``ATTN``: part of its tensors on the device, the rest overflowing to the next device or host memory), at most
one layer's share of tensors per device (the note says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.runtimes.llamacpp import _experts_bytes
from gpumem_gui.core.runtimes.llamacpp_fit_search import Device, fit_devices, override_blocks
from gpumem_gui.core.runtimes.ollama_split import split_shares
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import MiB


@dataclass(frozen=True)
class SplitFit:
    """What ``--fit`` chose over several GPUs: the layer split (``--tensor-split``), ``-ngl`` (the output
    layer counted), the blocks whose routed experts stay in host memory, and its log in words."""

    split: tuple[int, ...]
    n_gpu_layers: int
    cpu_experts: frozenset[int]
    note: str


def fit_split(
    spec: ModelSpec, run: InferenceRun, wb: WeightBytes, gpus: int, free: int, target_mib: int
) -> SplitFit:
    """llama.cpp's ``--fit`` of ``run`` (a llama.cpp run) on ``gpus`` equal GPUs with ``free`` bytes free
    each and a target of ``target_mib`` MiB."""
    n = spec.num_layers
    total = n + 1
    target = free - target_mib * MiB
    moe = spec.moe is not None

    def usage(split: tuple[int, ...], layers: int, cpu: frozenset[int] = frozenset()) -> list[int]:
        return [s.peak_bytes for s in split_shares(spec, run, wb, split, layers, True, cpu, True)]

    def experts(devs: tuple[Device, ...]) -> frozenset[int]:
        """The overridden blocks that have routed experts (a DeepSeek model's first blocks have none)."""
        return frozenset(i for i in override_blocks(devs, n) if spec.is_moe_layer(i))

    def use(devs: tuple[Device, ...]) -> list[int]:
        split = tuple(x.n_layer for x in devs)
        return usage(split, sum(split), experts(devs))

    even = (1,) * gpus
    if all(u <= target for u in usage(even, total)):
        msg = "--fit: the targets for free memory are met on every GPU, no changes needed"
        return SplitFit(even, total, frozenset(), msg)
    # global_surplus_cpu_moe: the default split with every routed expert in host memory
    surplus = sum(target - u for u in usage(even, total, frozenset(range(n)))) if moe else 0
    devs = fit_devices(gpus, n, moe, target, use, surplus)
    split = tuple(x.n_layer for x in devs)
    cpu = experts(devs)
    layers = sum(split)
    how = "back to front (--tensor-split)"
    if surplus > 0:
        how = "(--tensor-split): dense-only layers back to front, then full ones front to back"
    experts = f", the routed experts of {len(cpu)} blocks in host memory" if cpu else ""
    extra = " (llama.cpp's one extra split layer per GPU, LAYER_FRACTION_*, not modelled)" if cpu else ""
    note = (
        f"--fit: {layers} of {total} layers (the output layer counted) on the GPUs, split "
        f"{','.join(str(c) for c in split)} {how}{experts}{extra}"
    )
    return SplitFit(split, layers, cpu, note)


def split_fit_facts(
    spec: ModelSpec, wb: WeightBytes, plc: SplitFit, facts: Mapping[str, object]
) -> dict[str, object]:
    """``facts`` (the llama.cpp estimate's at the fit's ``-ngl``) with the routed experts the fit left in host
    memory: their block count and their bytes added to the host's."""
    if not plc.cpu_experts:
        return dict(facts)
    cpu = facts.get("cpu_bytes", 0)
    host = (cpu if isinstance(cpu, int) else 0) + _experts_bytes(spec, wb, plc.cpu_experts)
    return {**facts, "fit_cpu_expert_layers": len(plc.cpu_experts), "cpu_bytes": host}
