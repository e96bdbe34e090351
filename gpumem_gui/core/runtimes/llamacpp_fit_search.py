"""llama.cpp's ``--fit`` search, one implementation for one GPU and several (common/fit.cpp
``common_params_fit_impl`` with ``-c`` given and ``-ngl`` left to it; read at ggml-org/llama.cpp commit
08033df0, the stored version of the file). A single GPU is ``nd == 1`` of the same loops, as in the C++.

Step 3 fills the devices back to front ("filling dense(-only) layers back-to-front"): the last device gets the
most of the unassigned layers (the output layer among them, counted first: "the first layer is the output
layer which must always be full") that keep its target free, then the one before it, and so on. A MoE
model's layers are "dense-only" there: their routed experts (``ffn_*_exps``) in host memory, on the last
device all but its first layer's (``n_part = n_layer - 1``). When a MoE model's dense tensors fit on the
devices together (``global_surplus_cpu_moe > 0``), step 4 converts the dense-only layers back to full ones
front to back: device 0 takes full layers, first its own dense-only ones, then those of the next devices
(they move to it), while it keeps its target free; then device 1, and so on up to the first device that still
has dense-only layers. Each search is llama.cpp's method of false position as written (:func:`false_position`,
with its placements' quirks: the last device's first block stays full, a test after one layer on the last
device adds ``step - 1`` dense-only layers), so a use that is not monotone (a model whose first blocks have
no routed experts, DeepSeek's ``first_k_dense_replace``) ends where llama.cpp's does, not where a bisection
would. Not modelled: the one extra layer step 4 then tries to split per device (``LAYER_FRACTION_UP`` /
``GATE`` / ``ATTN``), at most one layer's share of tensors per device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

# the projected device bytes (``llama_memory_breakdown`` of a no-alloc load) of each device for a placement
Use = Callable[[tuple["Device", ...]], list[int]]
S = TypeVar("S")
# a placement's use on the device searched and that device's target
Mem = Callable[[S], tuple[int, int]]


@dataclass(frozen=True)
class Device:
    """One device's share of a placement (common/fit.cpp ``ngl_t``): ``n_layer`` layers (the output layer
    counting as one on the last device), the last ``n_part`` of them "dense-only" (their routed experts in
    host memory)."""

    n_layer: int
    n_part: int = 0

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def override_blocks(devices: tuple[Device, ...], hp_ngl: int) -> frozenset[int]:
    """The blocks whose routed experts overflow to host memory: common/fit.cpp set_ngl_tensor_split_tbo
    starts at ``il0 = hp_ngl + 1 - n_gpu_layers`` and, device by device, skips its ``n_full`` full layers and
    overrides its next ``n_part`` (index ``hp_ngl`` is the output layer, which has no experts)."""
    il0 = hp_ngl + 1 - sum(d.n_layer for d in devices)
    out: set[int] = set()
    for d in devices:
        il0 += d.n_full
        out.update(i for i in range(il0, il0 + d.n_part) if i < hp_ngl)
        il0 += d.n_part
    return frozenset(out)


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
