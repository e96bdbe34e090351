"""Host RAM and NVMe one rank needs for offloaded optimizer states and parameters.

* DeepSpeed ``offload_optimizer`` (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``): this rank's
  fp32 master partition (always a clone: ``single_partition_of_fp32_groups``, ``_create_fp32_partitions``),
  the optimizer's fp32 states on it, and the fp32 gradient partition the CPU Adam reads (pinned, kept:
  ``initialize_optimizer_states``). ``device = nvme`` (ZeRO-Infinity): the master weights and states live on
  NVMe; host RAM keeps the gradient partition and the swapper's pinned pool, ``buffer_count`` (4) buffers of
  the largest sub-group (``sub_group_size`` = 1e9 elements) in fp32 (``deepspeed/runtime/swap_tensor/
  optimizer_utils.py`` ``OptimizerSwapper.__init__``: ``SwapBufferManager(num_elems=largest_numel,
  count=buffer_count)``; ``deepspeed/runtime/zero/offload_config.py``).
* DeepSpeed ``offload_param`` (ZeRO-3): this rank's parameter partition in host RAM, or on NVMe with a
  pinned pool of ``buffer_count`` (5) x ``buffer_size`` (1e8 elements) in the model dtype
  (``offload_config.py`` ``DeepSpeedZeroOffloadParamConfig``; ``swap_tensor/partitioned_param_swapper.py``).
* FSDP ``CPUOffload``: the sharded parameters (and the step: states, fp32 master of a 16-bit model,
  gradients) in host RAM.
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.replay.optim import state_bytes_of
from gpumem_gui.core.replay.step import StepResult
from gpumem_gui.core.training.frameworks.deepspeed import SUB_GROUP, model_dtype
from gpumem_gui.core.training.model_parallel import rank_sharding
from gpumem_gui.core.training.precision import dtypes
from gpumem_gui.core.training.run import TrainingRun

OPTIMIZER_SWAP_BUFFERS = 4  # offload_config.py DeepSpeedZeroOffloadOptimizerConfig.buffer_count
PARAM_SWAP_BUFFERS = 5  # offload_config.py DeepSpeedZeroOffloadParamConfig.buffer_count
PARAM_SWAP_BUFFER = 100_000_000  # offload_config.py DeepSpeedZeroOffloadParamConfig.buffer_size (elements)


def offload_bytes(run: TrainingRun, res: StepResult) -> tuple[int, int]:
    """(host RAM, NVMe) one rank of the replayed stage needs for what the run offloads."""
    if run.offload == "none":
        return 0, 0
    sh = rank_sharding(run)  # over the dp x cp ranks
    n = res.trainable_params
    states = state_bytes_of(run.optimizer, n, (n,), "f32")
    mdt = model_dtype(run) if run.zero else None
    if mdt is None:  # FSDP CPUOffload (or a precision DeepSpeed does not recast)
        master = 4 * n if dtypes(run)[0] != "f32" else 0
        host = ceil((states + master + 4 * n) / sh.state_shard)
        if run.offload == "optimizer+params":
            host += ceil(res.full_param_bytes / sh.param_shard)
        return host, 0
    grads = ceil(4 * n / sh.state_shard)
    kept = ceil((states + 4 * n) / sh.state_shard)  # fp32 master partition + its states
    host, nvme = (grads + kept, 0) if run.offload_device == "cpu" else (grads, kept)
    if run.offload_device == "nvme":
        host += OPTIMIZER_SWAP_BUFFERS * 4 * min(SUB_GROUP, ceil(n / sh.state_shard))
    if run.offload == "optimizer+params":
        params = ceil(res.full_param_bytes / sh.param_shard)
        if run.offload_device == "cpu":
            host += params
        else:
            nvme += params
            host += PARAM_SWAP_BUFFERS * PARAM_SWAP_BUFFER * (4 if mdt == "f32" else 2)
    return host, nvme


def rank_facts(run: TrainingRun, res: StepResult, results: list[StepResult]) -> dict[str, int]:
    """Facts of the deciding rank that are not GPU peak bytes: NVMe for offload, paged optimizer states
    (outside the torch allocator), the ZeroRedundancyOptimizer rank replayed."""
    facts: dict[str, int] = {}
    if run.offload != "none":
        facts["nvme_bytes"] = sum(offload_bytes(run, r)[1] for r in results)
    if res.outside_allocator_bytes:
        facts["paged_optimizer_state_bytes"] = res.outside_allocator_bytes
    if res.state_owner is not None:
        facts["zero_state_rank"] = res.state_owner[0]
        facts["zero_state_params"] = res.state_owner[1]
    return facts


def rank_notes(res: StepResult) -> list[str]:
    """Warnings about memory the torch peak does not hold."""
    if not res.outside_allocator_bytes:
        return []
    gib = res.outside_allocator_bytes / (1 << 30)
    return [
        f"paged optimizer: {gib:.2f} GiB of optimizer states live in CUDA unified memory "
        "(cudaMallocManaged), outside the torch allocator, and are not in the peak: "
        "torch.cuda.max_memory_allocated / reserved never count them, while nvidia-smi shows them in the "
        "process's memory as long as they are paged in on the GPU, which they are until memory pressure "
        "evicts them to the CPU (bitsandbytes docs, Paged optimizers); states of parameters under 1e5 "
        "elements and 8-bit absmax stay in the torch allocator"
    ]
