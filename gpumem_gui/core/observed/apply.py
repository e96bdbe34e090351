"""Apply a :class:`~gpumem_gui.core.observed.calibration.Calibration` to an estimate.

The calibration replaces the estimate's default overheads beyond the live tensors with what the measurement
implies, on every GPU and every rank class alike, and moves each total by exactly the difference; the
live-tensor peak and the phases do not change. Each new component's explanation names the calibration, its
measurement and its date (the note a user sees in the breakdown).
"""

from __future__ import annotations

from typing import Literal

from gpumem_gui.core.observed.calibration import Calibration
from gpumem_gui.core.results.estimate import Component, Estimate, Explanation, GpuShare, RankClass

Quantity = Literal["non_torch", "allocator"]

# The estimate components a calibration replaces, each with the measured quantity that takes its place (the
# one place that says so; core/results/overheads.py builds these defaults). 'cuda_context' is the default
# for the memory of the process outside PyTorch's allocator; 'allocator_reserve' the default for reserved
# over allocated. The cuBLAS workspace ('workspace') is not here: PyTorch allocates it through its caching
# allocator (aten/src/ATen/cuda/CublasHandlePool.cpp, allocateCUDABlasWorkspace), so a measurement counts
# it inside allocated and reserved, never in the non-PyTorch memory. Several keys may map to one quantity
# (a split of today's defaults): the first one found is replaced, the others are dropped.
REPLACED_BY: dict[str, Quantity] = {
    "cuda_context": "non_torch",  # NCCL's buffers stay modelled: they scale with the layout (calibration.py)
    "allocator_reserve": "allocator",
}


def _source(cal: Calibration) -> str:
    m = cal.measurement
    stack = f"; {cal.stack.text()}" if cal.stack.text() else ""
    return (
        f"calibration '{cal.name}': {', '.join(m.source_formats)} on {cal.gpu_name}, {m.measured_on}{stack}"
    )


def _component(cal: Calibration, quantity: Quantity, peak_bytes: int) -> Component | None:
    """The calibrated component for ``quantity`` on a GPU whose live-tensor peak is ``peak_bytes``; None
    when the calibration did not measure it (the default stays)."""
    inputs: dict[str, int | float | str | bool | None] = {
        "calibration": cal.name,
        "measured_on": cal.measurement.measured_on.isoformat(),
    }
    if quantity == "non_torch":
        if cal.non_torch_bytes is None:
            return None
        return Component(
            key="non_torch",
            label=f"non-PyTorch memory (calibration '{cal.name}')",
            bytes=cal.non_torch_bytes,
            explain=Explanation(
                formula=f"measured: {cal.non_torch_formula}", inputs=inputs, source=_source(cal)
            ),
        )
    if cal.allocator_ratio is None:
        return None
    reserve = round(peak_bytes * (cal.allocator_ratio - 1))
    return Component(
        key="allocator_reserve",
        label=f"allocator reserve (calibration '{cal.name}')",
        bytes=reserve,
        explain=Explanation(
            formula=f"reserve = peak x (reserved / allocated - 1); measured {cal.allocator_formula}",
            inputs={**inputs, "peak_bytes": peak_bytes, "ratio": cal.allocator_ratio},
            source=_source(cal),
        ),
    )


def _replace(
    comps: tuple[Component, ...], peak_bytes: int, cal: Calibration
) -> tuple[tuple[Component, ...], int]:
    """``comps`` with the :data:`REPLACED_BY` components replaced, and how many bytes that adds (negative:
    removes)."""
    out: list[Component] = []
    done: set[Quantity] = set()
    delta = 0
    for c in comps:
        quantity = REPLACED_BY.get(c.key)
        new = (
            None
            if quantity is None or c.explain.inputs.get("calibration")
            else _component(cal, quantity, peak_bytes)
        )
        if quantity is None or new is None:
            out.append(c)
        elif quantity in done:
            delta -= c.bytes
        else:
            out.append(new)
            done.add(quantity)
            delta += new.bytes - c.bytes
    return tuple(out), delta


def _share(s: GpuShare, cal: Calibration) -> GpuShare:
    comps, delta = _replace(s.components, s.peak_bytes, cal)
    return s.model_copy(update={"components": comps, "total_bytes": s.total_bytes + delta})


def _ranks(ranks: tuple[RankClass, ...], cal: Calibration) -> tuple[RankClass, ...]:
    """Every rank class calibrated; the one with the largest total (ties: the first) decides the fit, as
    core/training/ranks.py rank_classes chooses it."""
    out = []
    for r in ranks:
        comps, delta = _replace(r.components, r.peak_bytes, cal)
        out.append(r.model_copy(update={"components": comps, "total_bytes": r.total_bytes + delta}))
    if not out:
        return ()
    worst = max(range(len(out)), key=lambda i: out[i].total_bytes)
    return tuple(r.model_copy(update={"decides": i == worst}) for i, r in enumerate(out))


def calibration_applies(est: Estimate) -> bool:
    """Whether ``est`` has a component a calibration replaces (:data:`REPLACED_BY`)."""
    return any(c.key in REPLACED_BY for s in est.per_gpu for c in s.components)


def apply_calibration(est: Estimate, cal: Calibration) -> Estimate:
    """``est`` with ``cal``'s measured overheads instead of the defaults (module docstring). An estimate
    with none of the replaced components (an engine that budgets its own non-PyTorch memory) comes back
    with a warning saying the calibration was not applied."""
    if "calibration" in est.facts:  # calibrated already (by its target): once only
        return est
    if not calibration_applies(est):
        names = ", ".join(REPLACED_BY)
        return est.model_copy(
            update={
                "warnings": (
                    *est.warnings,
                    f"calibration '{cal.name}' not applied: the {est.engine} estimate has none of the "
                    f"components it replaces ({names})",
                )
            }
        )
    comps, delta = _replace(est.components, est.peak_bytes, cal)
    shares = tuple(_share(s, cal) for s in est.per_gpu)
    update: dict[str, object] = {
        "components": comps,
        "total_bytes": est.total_bytes + delta,
        "per_gpu": shares,
        "ranks": _ranks(est.ranks, cal),
        "facts": {**est.facts, "calibration": cal.name},
    }
    worst = max(shares, key=lambda s: s.total_bytes)
    if worst.total_bytes > est.total_bytes + delta:  # another GPU now holds the most: it decides
        update.update(components=worst.components, total_bytes=worst.total_bytes, peak_bytes=worst.peak_bytes)
        update["warnings"] = (
            *est.warnings,
            f"with calibration '{cal.name}', GPU {worst.index} ({worst.role}) holds the most; the phases "
            "shown are those of the GPU that held the most before",
        )
    return est.model_copy(update=update)


def calibration_note(cal: Calibration) -> str:
    """The one line a front end shows when ``cal`` applies to an estimate."""
    return f"calibration '{cal.name}' applied: {cal.summary()}"
