"""Training frameworks behind one protocol (:class:`~.base.Framework`): which one a run uses and how it
lays out one rank's state. A new framework is one module here plus its entry in :data:`FRAMEWORKS`."""

from __future__ import annotations

from gpumem_gui.core.training.frameworks.base import Framework, Sharding
from gpumem_gui.core.training.frameworks.ddp import DDP
from gpumem_gui.core.training.frameworks.deepspeed import DEEPSPEED
from gpumem_gui.core.training.frameworks.fsdp import FSDP
from gpumem_gui.core.training.run import TrainingRun

__all__ = ["FRAMEWORKS", "Framework", "Sharding", "framework"]

FRAMEWORKS: tuple[Framework, ...] = (DEEPSPEED, FSDP, DDP)


def framework(run: TrainingRun) -> Framework:
    """The framework ``run`` selects (the run model forbids selecting two)."""
    return next(f for f in FRAMEWORKS if f.selected(run))
