"""GPU targets from text, one parser for the CLI's ``--gpu`` and the window's custom GPU.

A target is a catalog GPU by name (``H100``, ``RTX-4090:4``) or any GPU by its capacity (``24GiB``,
``80GB:4``, ``23.5GiB:2``): GiB, MiB and TiB are binary (2^30, 2^20, 2^40 bytes), GB, MB and TB decimal
(10^9, 10^6, 10^12), as :mod:`gpumem_gui.core.units` defines them. ``:COUNT`` is the number of such GPUs.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import TypeVar

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.fit import GpuTarget
from gpumem_gui.core.readers.catalog import GpuInfo, find_gpu
from gpumem_gui.core.results.nontorch import arch_of
from gpumem_gui.core.units import GB, KB, MB, GiB, KiB, MiB

# GpuTarget.count's bound: the run models' parallel degrees (tp, pp, dp, ...) go to 4,096 too
MAX_GPUS = 4096
# a custom capacity below this cannot hold even the CUDA context (~300-600 MiB on recent drivers, the run
# field cuda_context_mib); a definition of "too small to be a GPU" rather than a measurement
MIN_CUSTOM_BYTES = 512 * MiB
# 4 TiB: about 14x the largest GPU memory in the catalog (B300 and MI355X, 288 GB); a bound that catches a
# wrong unit (24TB for 24GB) while leaving room for cards not yet made
MAX_CUSTOM_BYTES = 4 << 40
# the longest --gpu text read at all: catalog ids are at most 60 characters (GpuInfo.id), plus ':4096'; an
# error message may repeat all of it (the house rule: at most ~80 characters of a user's value)
MAX_TARGET_TEXT = 80
UNITS = {"GiB": GiB, "GB": GB, "MiB": MiB, "MB": MB, "TiB": KiB * GiB, "TB": KB * GB}
_CAPACITY = re.compile(r"^(\d{1,7}(?:\.\d{1,6})?|\.\d{1,6})\s*([A-Za-z]+)$")


def parse_capacity(text: str) -> int | None:
    """Bytes of a capacity such as ``24GiB``, ``80 GB`` or ``23.5GiB`` (units: GiB, GB, MiB, MB, TiB, TB,
    any case); None when ``text`` is not written as a number and a unit (then it names a catalog GPU).

    A capacity outside 512 MiB to 4 TiB raises :class:`GpumemInputError` (field ``gpu``)."""
    m = _CAPACITY.match(text.strip())
    if not m:
        return None
    units = {u.lower(): (u, f) for u, f in UNITS.items()}
    unit = units.get(m.group(2).lower())
    if unit is None:
        raise GpumemInputError(
            f"unknown unit {short(m.group(2))} in capacity {short(text.strip())} "
            f"(use {', '.join(UNITS)}: GiB = 2^30 bytes, GB = 10^9)",
            field="gpu",
        )
    n = int(Decimal(m.group(1)) * unit[1])  # whole bytes, rounded down
    if not MIN_CUSTOM_BYTES <= n <= MAX_CUSTOM_BYTES:
        raise GpumemInputError(
            f"capacity {short(text.strip())} is {n:,} bytes; a GPU's memory must be 512 MiB to 4 TiB",
            field="gpu",
        )
    return n


def capacity_name(text: str) -> str:
    """How a custom capacity is named in reports: ``custom 23.5 GiB``."""
    m = _CAPACITY.match(text.strip())
    if not m:
        return f"custom {text.strip()}"
    unit = next(u for u in UNITS if u.lower() == m.group(2).lower())
    return f"custom {m.group(1)} {unit}"


def parse_count(text: str) -> int:
    """The ``:COUNT`` of a target: 1 to 4,096 GPUs."""
    t = text.strip()
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if not (t.isascii() and t.isdigit()) or len(t) > 6 or not 1 <= int(t) <= MAX_GPUS:
        raise GpumemInputError(f"GPU count must be 1 to {MAX_GPUS:,}, got {short(t)}", field="gpu")
    return int(t)


def gpu_target_from_text(text: str) -> GpuTarget:
    """The target ``text`` names: ``NAME[:COUNT]`` (a catalog GPU) or ``CAPACITY[:COUNT]`` (any GPU).

    Raises :class:`GpumemInputError` (field ``gpu``) naming the problem; never echoes more than ~80
    characters of ``text`` (:func:`~gpumem_gui.core.errors.short`)."""
    t = text.strip()
    if not t:
        raise GpumemInputError(
            "give a catalog GPU (H100, RTX-4090:2) or a capacity (24GiB, 80GB:4)", field="gpu"
        )
    if len(t) > MAX_TARGET_TEXT:
        raise GpumemInputError(
            f"GPU {short(t)} is too long (at most {MAX_TARGET_TEXT} characters)", field="gpu"
        )
    name, sep, count_text = t.partition(":")
    count = parse_count(count_text) if sep else 1
    capacity = parse_capacity(name)
    if capacity is not None:
        return GpuTarget(name=capacity_name(name), capacity_bytes=capacity, count=count)
    if re.fullmatch(r"\d+(\.\d+)?", name.strip()) and not _catalog_name(name):
        raise GpumemInputError(
            f"{short(name.strip())}: a capacity needs a unit (24GiB = 24 x 2^30 bytes, 24GB = 24 x 10^9)",
            field="gpu",
        )
    return catalog_target(find_gpu(name), count)


def catalog_target(g: GpuInfo, count: int = 1) -> GpuTarget:
    """``count`` GPUs of catalog entry ``g``: nvidia-smi's total and CUDA's (gpus.json)."""
    return GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, cuda_bytes=g.cuda_memory_bytes, count=count)


def _catalog_name(name: str) -> bool:
    """Whether ``name`` is a catalog id or alias (``4090`` is one)."""
    try:
        find_gpu(name)
    except GpumemInputError:
        return False
    return True


R = TypeVar("R")


def target_arch(target: GpuTarget | str) -> str | None:
    """The GPU generation of a catalog target or GPU name (its compute capability); None for a capacity, an
    AMD GPU or a name the catalog does not know (a local GPU's NVML name may not be one)."""
    try:
        cc = find_gpu(target if isinstance(target, str) else target.name).compute_capability
    except GpumemInputError:
        return None
    return arch_of(cc) if cc is not None else None


def with_target_arch(run: R, target: GpuTarget | str | None) -> R:
    """``run`` with ``gpu_arch`` ``auto`` taken as the target GPU's generation (core/results/nontorch.py sizes
    the CUDA context and cuBLAS workspaces by it); any other run unchanged."""
    arch = target_arch(target) if target is not None and getattr(run, "gpu_arch", None) == "auto" else None
    return run if arch is None else run.model_copy(update={"gpu_arch": arch})  # type: ignore[attr-defined]
