"""PyTorch FSDP: ``FULL_SHARD`` shards parameters, gradients and optimizer states over the data-parallel
ranks and gathers one unit (decoder layer) at a time, the root unit (embeddings, final norm, head) staying
gathered; ``SHARD_GRAD_OP`` keeps every unit gathered for the step; ``HYBRID_SHARD`` shards within a node of
``gpus_per_node`` GPUs and replicates across nodes; ``CPUOffload(offload_params=True)`` keeps parameters (and
the optimizer step) on the CPU. Source: ``torch/distributed/fsdp`` (ShardingStrategy, BACKWARD_PRE)."""

from __future__ import annotations

from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload, nothing_to_shard
from gpumem_gui.core.training.run import TrainingRun


class Fsdp(Framework):
    name = "fsdp"
    source = "torch/distributed/fsdp (ShardingStrategy, BackwardPrefetch.BACKWARD_PRE)"

    def selected(self, run: TrainingRun) -> bool:
        return run.fsdp != "none"

    def sharding(self, run: TrainingRun) -> Sharding:
        g = max(1, min(run.dp, run.gpus_per_node)) if run.fsdp == "hybrid_shard" else run.dp
        gather = "none" if g == 1 else ("all" if run.fsdp == "shard_grad_op" else "unit")
        offload_params = run.offload == "optimizer+params"
        return Sharding(
            state_shard=g,
            grad_shard=g,
            param_shard=g,
            gather="unit" if offload_params and gather == "none" else gather,
            states_offloaded=run.offload != "none",
            params_offloaded=offload_params,
            states_sharded=True,
            grads_sharded=True,
            flat_states=True,
        )

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        if run.offload == "optimizer+params" and run.fsdp == "shard_grad_op":
            raise no_param_offload()
        return nothing_to_shard(run)

    def trainer_args(self, run: TrainingRun) -> list[str]:
        return [f"fsdp='{run.fsdp}'" + (" offload" if run.offload == "optimizer+params" else "")]


FSDP = Fsdp()
