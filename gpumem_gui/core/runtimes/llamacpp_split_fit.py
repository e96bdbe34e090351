"""llama.cpp's ``--fit`` over several GPUs (common/fit.cpp ``common_params_fit_impl`` with more than one
device and ``-c`` given; read at ggml-org/llama.cpp commit 08033df0, the stored version of the file, whose
steps 3 and 4 are those of the single-GPU model in :mod:`.llamacpp_fit`).

Step 1 projects llama.cpp's default layer split (``--tensor-split`` unset: by each device's free memory, equal
on equal GPUs) and changes nothing when every device keeps its target free ("targets for free memory can be
met on all devices"). Otherwise step 3 fills the devices back to front ("filling dense(-only) layers
back-to-front"): the last device gets the most of the unassigned layers (the output layer among them) that
keep its target free, then the one before it, and so on. A MoE model's layers are "dense-only" there: their
routed experts (``ffn_*_exps``) in host memory, on the last device all but its first layer's
(``n_part = n_layer - 1``, the output layer being "always full"). When a MoE model's dense tensors fit on the
devices together (``global_surplus_cpu_moe > 0``: the default split with every expert in host memory leaves
more than the targets free in sum), step 4 converts the dense-only layers back to full ones front to back:
device 0 takes full layers, first its own dense-only ones, then those of the next devices (they move to it),
while it keeps its target free; then device 1, and so on up to the first device that still has dense-only
layers. Each search is llama.cpp's method of false position as written (:func:`false_position`, with its
placements' quirks: the last device's first block stays full, a test after one layer on the last device
adds ``step - 1`` dense-only layers), so a use that is not monotone (a model whose first blocks have no
routed experts) ends where llama.cpp's does. The routed experts left in host memory are multiplied on GPU 0
(op offload), whose compute buffer holds one layer's copy. The counts become ``--tensor-split`` and their
sum ``-ngl``; the dense-only layers become ``-ot`` overrides (:func:`.llamacpp_fit.override_blocks`). Not
modelled: the
one extra layer step 4 then tries to split per device (``LAYER_FRACTION_UP`` / ``GATE`` / ``ATTN``: part of
its tensors on the device, the rest overflowing to the next device or host memory), at most one layer's
share of tensors per device (the note says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.runtimes.llamacpp import _experts_bytes
from gpumem_gui.core.runtimes.llamacpp_fit import Device, override_blocks
from gpumem_gui.core.runtimes.ollama_split import split_shares
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import MiB

# the projected device bytes (``llama_memory_breakdown`` of a no-alloc load) of each device for a placement
Use = Callable[[tuple[Device, ...]], list[int]]
S = TypeVar("S")
# a placement's use on the device searched and that device's target
Mem = Callable[[S], tuple[int, int]]


@dataclass(frozen=True)
class SplitFit:
    """What ``--fit`` chose over several GPUs: the layer split (``--tensor-split``), ``-ngl`` (the output
    layer counted), the blocks whose routed experts stay in host memory, and its log in words."""

    split: tuple[int, ...]
    n_gpu_layers: int
    cpu_experts: frozenset[int]
    note: str


def false_position(low: S, high: S, size: Callable[[S], int], grow: Callable[[S, int], S], mem: Mem[S]) -> S:
    """common_params_fit_impl's method of false position between placements ``low`` and ``high`` (whose use
    ``mem`` gives as (use, target), ``high``'s above the target), ``size`` the count searched: each step
    interpolates where the use meets the target (a negative guess wraps around as ``uint32_t``: the largest
    step), clamped to [1, delta - 1], and ``grow`` makes the next test from the low placement; it returns the
    last placement within the target (``low`` when none was)."""
    (m_low, target), (m_high, _) = mem(low), mem(high)
    while (delta := size(high) - size(low)) > 1:
        headroom = m_high - m_low
        if headroom > 0:  # C++: int64 division truncating towards zero, then uint32_t
            guess = abs(delta * (target - m_low)) // headroom * (1 if target >= m_low else -1)
            step = guess % 2**32
        else:
            step = delta - 1
        test = grow(low, min(max(step, 1), delta - 1))
        m = mem(test)[0]
        if m <= target:
            low, m_low = test, m
        else:
            high, m_high = test, m
    return low


def fill_back_to_front(nd: int, hp_ngl: int, moe: bool, target: int, use: Use) -> tuple[Device, ...]:
    """common_params_fit_impl step 3: per device from the last, all of the unassigned layers when they keep
    its use within ``target``, else where its search ends; a MoE model's as dense-only layers (a test adds
    ``step`` to both counts, ``step - 1`` to ``n_part`` on the last device while it has none)."""
    devs: tuple[Device, ...] = (Device(0),) * nd
    for d in reversed(range(nd)):
        left = hp_ngl + 1 - sum(x.n_layer for x in devs[d + 1 :])
        if not left:
            continue

        def put(base: tuple[Device, ...], x: Device, d: int = d) -> tuple[Device, ...]:
            return (*base[:d], x, *base[d + 1 :])

        def grow(base: tuple[Device, ...], step: int, d: int = d) -> tuple[Device, ...]:
            x = base[d]
            add = (step - 1 if d == nd - 1 and x.n_part == 0 else step) if moe else 0
            return put(base, Device(x.n_layer + step, x.n_part + add))

        high = put(devs, Device(left, (left if d < nd - 1 else left - 1) if moe else 0))
        if use(high)[d] <= target:
            devs = high
        else:
            devs = false_position(
                devs, high, lambda s, d=d: s[d].n_layer, grow, lambda s, d=d: (use(s)[d], target)
            )
    return devs


def _convert(devs: tuple[Device, ...], d: int, start: int, c: int) -> tuple[tuple[Device, ...], int]:
    """Step 4's test placement: ``c`` dense-only layers, from device ``start`` on, become full layers of
    device ``d``; with the device where the conversion stopped (``id_dense_start_test``)."""
    out, done, j = list(devs), 0, start
    while j < len(out):
        k = min(c - done, out[j].n_part)
        out[j] = Device(out[j].n_layer - k, out[j].n_part - k)
        out[d] = Device(out[d].n_layer + k, out[d].n_part)
        done += k
        if out[j].n_part > 0:
            break
        j += 1
    return tuple(out), j


def convert_front_to_back(devs: tuple[Device, ...], target: int, use: Use) -> tuple[Device, ...]:
    """common_params_fit_impl step 4: dense-only layers back to full ones, front to back, while each device
    keeps its use within ``target``."""
    nd = len(devs)
    start = nd  # id_dense_start: the first of the trailing devices that hold layers
    while start > 0 and devs[start - 1].n_layer > 0:
        start -= 1
    d = 0
    while d <= start < nd:
        high = list(devs)  # every dense-only layer from ``start`` on moved to ``d`` as a full layer
        for j in range(start, nd):
            move = high[j].n_layer - (1 if j == nd - 1 else 0)
            high[d] = Device(high[d].n_layer + move, high[d].n_part)
            high[j] = Device(high[j].n_layer - move, 0)
        if use(tuple(high))[d] <= target:
            devs, start = tuple(high), nd - 1
        else:
            devs, start = false_position(
                (devs, start),
                (tuple(high), nd - 1),
                lambda s, d=d: s[0][d].n_full,
                lambda s, step, d=d: _convert(s[0], d, s[1], step),
                lambda s, d=d: (use(s[0])[d], target),
            )
        d += 1
    return devs


def fit_devices(nd: int, hp_ngl: int, moe: bool, target: int, use: Use, surplus: int) -> tuple[Device, ...]:
    """Steps 3 and 4 on ``nd`` equal devices: ``surplus`` is ``global_surplus_cpu_moe`` (step 4 runs for a
    MoE model only when it is above 0)."""
    devs = fill_back_to_front(nd, hp_ngl, moe, target, use)
    return convert_front_to_back(devs, target, use) if moe and surplus > 0 else devs


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
        return [s.peak_bytes for s in split_shares(spec, run, wb, split, layers, True, cpu)]

    def use(devs: tuple[Device, ...]) -> list[int]:
        split = tuple(x.n_layer for x in devs)
        return usage(split, sum(split), override_blocks(devs, n))

    even = (1,) * gpus
    if all(u <= target for u in usage(even, total)):
        msg = "--fit: the targets for free memory are met on every GPU, no changes needed"
        return SplitFit(even, total, frozenset(), msg)
    # global_surplus_cpu_moe: the default split with every routed expert in host memory
    surplus = sum(target - u for u in usage(even, total, frozenset(range(n)))) if moe else 0
    devs = fit_devices(gpus, n, moe, target, use, surplus)
    split = tuple(x.n_layer for x in devs)
    cpu = override_blocks(devs, n)
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
