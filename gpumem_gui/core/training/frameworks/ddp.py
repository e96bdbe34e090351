"""Plain PyTorch / HF Trainer, alone or under ``DistributedDataParallel``: every rank holds the whole model
and its gradients; with more than one data-parallel rank the reducer's flat gradient buckets come on top
(``bucket_cap_mb``, ``gradient_as_bucket_view``: :mod:`gpumem_gui.core.training.buckets`). ``zero = 1`` with
``zero_impl = torch`` is ``ZeroRedundancyOptimizer`` under DDP: each rank keeps the optimizer states of the
whole parameters assigned to it (greedily by size), so the rank holding the embedding carries more than
1/dp of them."""

from __future__ import annotations

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload, nothing_to_shard
from gpumem_gui.core.training.run import TrainingRun


def _torch_zero(run: TrainingRun) -> bool:
    return run.zero > 0 and run.zero_impl == "torch"


class Ddp(Framework):
    name = "ddp"
    source = "torch/nn/parallel/distributed.py (DistributedDataParallel, gradient_as_bucket_view)"

    def selected(self, run: TrainingRun) -> bool:
        return run.fsdp == "none" and (run.zero == 0 or _torch_zero(run))

    def sharding(self, run: TrainingRun) -> Sharding:
        # ``run`` may be the dp x cp view of the run (training/model_parallel.py shard_run): DDP's reducer and
        # ZeroRedundancyOptimizer span the data-parallel ranks only (context parallelism without FSDP keeps
        # its own gradient sync: torchtitan shards over dp x cp with FSDP, Megatron-LM with its own buffers)
        dp = run.dp // run.cp
        zero = _torch_zero(run) and dp > 1
        return Sharding(
            states_offloaded=run.offload != "none",
            states_sharded=zero,
            ddp_buckets=dp > 1,
            whole_param_states=zero,
        )

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        if _torch_zero(run):
            if run.zero > 1:
                raise GpumemInputError(
                    "zero_impl 'torch' (ZeroRedundancyOptimizer) shards optimizer states only: ZeRO stage 1, "
                    f"not {run.zero} (use zero_impl 'deepspeed' or FSDP)",
                    field="zero_impl",
                )
            if run.offload != "none":
                raise GpumemInputError(
                    "zero_impl 'torch' (ZeroRedundancyOptimizer) cannot offload; use zero_impl 'deepspeed'",
                    field="offload",
                )
            # ZeroRedundancyOptimizer spans the data-parallel ranks only (see sharding)
            return nothing_to_shard(run.dp // run.cp)
        if run.offload == "optimizer+params":
            raise no_param_offload()
        return []


DDP = Ddp()
