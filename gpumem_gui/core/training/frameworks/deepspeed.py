"""DeepSpeed ZeRO: stage 1 shards the optimizer states over the data-parallel ranks, stage 2 the gradients
too (reduce-scattered as they appear), stage 3 the parameters too (one layer gathered at a time, the root
unit for the whole step); ``offload_optimizer`` keeps states on the CPU (the CPU Adam reads gradients
there), ``offload_param`` (ZeRO-3) the parameters. Sources: ``deepspeed/runtime/zero/stage_1_and_2.py``,
``stage3.py``, ZeRO paper (Rajbhandari et al. 2020)."""

from __future__ import annotations

from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload, nothing_to_shard
from gpumem_gui.core.training.run import TrainingRun


class DeepSpeed(Framework):
    name = "deepspeed"
    source = "deepspeed/runtime/zero (stage_1_and_2.py, stage3.py)"

    def selected(self, run: TrainingRun) -> bool:
        return run.zero > 0

    def sharding(self, run: TrainingRun) -> Sharding:
        z, dp = run.zero, run.dp
        offload_params = run.offload == "optimizer+params"
        gather = "unit" if z >= 3 and dp > 1 else "none"
        return Sharding(
            state_shard=dp,
            grad_shard=dp if z >= 2 else 1,
            param_shard=dp if z >= 3 else 1,
            gather="unit" if offload_params else gather,
            states_offloaded=run.offload != "none",
            params_offloaded=offload_params,
            states_sharded=True,
            grads_sharded=z >= 2,
            flat_states=True,
        )

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        if run.offload == "optimizer+params" and run.zero != 3:
            raise no_param_offload()
        return nothing_to_shard(run)

    def trainer_args(self, run: TrainingRun) -> list[str]:
        offload = {
            "optimizer": ", offload_optimizer=cpu",
            "optimizer+params": ", offload_optimizer+param=cpu",
        }
        return [f"deepspeed='ds_zero{run.zero}.json'  # ZeRO stage {run.zero}{offload.get(run.offload, '')}"]


DEEPSPEED = DeepSpeed()
