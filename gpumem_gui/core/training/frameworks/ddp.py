"""Plain PyTorch / HF Trainer, alone or under ``DistributedDataParallel``: every rank holds the whole model,
its gradients and its optimizer states (DDP's bucketed all-reduce views the gradients in place,
``gradient_as_bucket_view``)."""

from __future__ import annotations

from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload
from gpumem_gui.core.training.run import TrainingRun


class Ddp(Framework):
    name = "ddp"
    source = "torch/nn/parallel/distributed.py (gradient_as_bucket_view)"

    def selected(self, run: TrainingRun) -> bool:
        return run.zero == 0 and run.fsdp == "none"

    def sharding(self, run: TrainingRun) -> Sharding:
        return Sharding(states_offloaded=run.offload != "none")

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        if run.offload == "optimizer+params":
            raise no_param_offload()
        return []


DDP = Ddp()
