"""llama.cpp's automatic placement (``-ngl auto`` with ``--fit on``) on one GPU.

common/fit.cpp ``common_params_fit_impl`` (llama.cpp; the build Ollama v0.30+ pins, b10488, has it, and
``common/common.h`` turns it on by default: ``fit_params = true``, ``fit_params_target`` 1024 MiB per device,
``fit_params_min_ctx`` 4096) measures the device memory of a placement (model + context + compute, the
``llama_memory_breakdown`` of a no-alloc load) and, in order:

1. leaves everything as it is when the projected use leaves at least the target free
   (``will leave ... no changes needed``);
2. lowers the context only when the user did not set ``-c`` (``n_ctx == 0``): gpumem and Ollama always set it,
   so this step only logs ``context size set by user``;
3. gives up on the layers when ``-ngl`` was set by the user (``n_gpu_layers already set by user``);
4. fills the GPU back to front: a dense model gets the most whole layers that fit (the output layer counts as
   one, ``hp_ngl + 1``); a MoE model first with its routed experts (``ffn_*_exps``) in host memory
   ("dense-only" layers: ``n_part = n_layer - 1``, the first block of the GPU's range keeping its experts);
5. for a MoE model whose dense tensors all fit (``global_surplus_cpu_moe > 0``), converts dense-only layers
   back to full ones front to back while they fit.

Steps 4 and 5 are the loops every device count runs (``nd == 1`` here,
:func:`.llamacpp_fit_search.fit_devices`): llama.cpp's method of false position as written, so a use that does
not grow with each layer (a MoE model whose first blocks have no routed experts) ends where llama.cpp's search
ends. ``-ngl`` then counts the output
layer first (``src/llama-model.cpp`` ``load_tensors``: ``i_gpu_start = n_layer + 1 - n_gpu_layers``). Not
modelled: the one extra layer llama.cpp then tries to split (``LAYER_FRACTION_UP`` / ``GATE``: its up (and
gate) experts on the GPU too), at most one layer's share of experts (said in the estimate's note).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpumem_gui.core.runtimes.llamacpp_fit_search import Device, fit_devices, override_blocks
from gpumem_gui.core.units import MiB

# (GPU layers counting the output layer as one, blocks whose routed experts stay in host memory) -> bytes
Usage = Callable[[int, frozenset[int]], int]


@dataclass(frozen=True)
class FitPlacement:
    """What ``--fit`` chose: ``n_gpu_layers`` (-1: every layer, unchanged), the blocks whose routed experts
    it left in host memory, and its log in words."""

    n_gpu_layers: int
    cpu_experts: frozenset[int]
    note: str
    projected: int  # the device bytes with every layer and expert on the GPU (fit's first projection)


def fit_single_gpu(hp_ngl: int, moe: frozenset[int], free: int, target_mib: int, used: Usage) -> FitPlacement:
    """common_params_fit_impl on one device with ``-c`` given: ``moe`` the blocks with routed experts (none:
    a dense model), ``free`` bytes free on the GPU (after the process's CUDA context), a margin of
    ``target_mib`` MiB, ``used`` the projected device bytes of a placement. A block without experts that
    falls among the overridden ones (a DeepSeek model's first blocks) matches no ``ffn_*_exps`` tensor: it
    counts in the search's placements but moves nothing."""
    target = free - target_mib * MiB
    full = used(-1, frozenset())
    if full <= target:
        return FitPlacement(-1, frozenset(), f"--fit: {full // MiB} MiB projected, no changes needed", full)
    total = hp_ngl + 1

    def use(devs: tuple[Device, ...]) -> list[int]:
        return [used(devs[0].n_layer, override_blocks(devs, hp_ngl) & moe)]

    # global_surplus_cpu_moe: every layer on the GPU, every routed expert in host memory
    surplus = target - used(-1, moe) if moe else 0
    (dev,) = fit_devices(1, hp_ngl, bool(moe), target, use, surplus)
    k, parts = dev.n_layer, override_blocks((dev,), hp_ngl) & moe
    if k == 0 and used(0, frozenset()) > target:  # not even the compute buffer: llama.cpp goes on with -ngl 0
        return FitPlacement(
            0,
            frozenset(),
            f"--fit: nothing fits {target_mib} MiB below the free memory; llama.cpp keeps every layer in "
            "host memory (-ngl 0) and the GPU still holds its compute buffer",
            full,
        )
    where = "every layer" if k == total else f"{k} of {total} layers (the output layer counted)"
    experts = f", the routed experts of {len(parts)} layers in host memory" if parts else ""
    extra = " (llama.cpp's one extra split layer, LAYER_FRACTION_UP/GATE, not modelled)" if parts else ""
    note = f"--fit: {full // MiB} MiB projected above the target; {where} on the GPU{experts}{extra}"
    return FitPlacement(k, parts, note, full)


def fit_needed_bytes(facts: Mapping[str, object], context: int) -> int | None:
    """What a GPU must have for every layer and expert to stay there when ``--fit`` moved some to host memory
    (its first projection plus the CUDA context), for a fit verdict; None when it moved nothing."""
    moved = facts.get("fit_n_gpu_layers", -1) != -1 or facts.get("fit_cpu_expert_layers")
    projected = facts.get("fit_projected_bytes")
    return int(projected) + context if moved and isinstance(projected, int) else None
