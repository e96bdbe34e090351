"""The training-framework protocol: how a framework lays one rank's state out over the data-parallel ranks.

A framework (one module each: plain PyTorch / DDP, DeepSpeed ZeRO, PyTorch FSDP) answers with a
:class:`Sharding`; the replay turns it into hooks (:class:`~gpumem_gui.core.training.sharding.ShardingHooks`)
and optimizer options, so no framework is written into the autograd engine or the model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.run import TrainingRun

Gather = Literal["none", "unit", "all"]


@dataclass(frozen=True)
class Sharding:
    """One rank's share: optimizer states, gradients and parameters are each divided over that many
    data-parallel ranks; ``gather`` says how full parameters come back (``unit``: one FSDP unit / ZeRO-3
    layer at a time, ``all``: every unit for the whole step); offload keeps states (and parameters) in CPU
    RAM. ``states_sharded``/``grads_sharded`` say whether the framework shards them at all (even over one
    rank), for the explanations. ``flat_states``: optimizer states exist for every trainable parameter, also
    one no step gives a gradient (a multimodal model's vision tower in a text-only step): DeepSpeed's flat
    fp32 partitions, FSDP's FlatParameter; torch's own optimizers skip a parameter whose ``.grad`` is None.
    ``ddp_buckets``: ``DistributedDataParallel``'s reducer keeps flat gradient buckets
    (:mod:`gpumem_gui.core.training.buckets`); ``whole_param_states``: states are partitioned by whole
    parameters (torch ``ZeroRedundancyOptimizer``), not split evenly (``state_shard`` is then 1)."""

    state_shard: int = 1
    grad_shard: int = 1
    param_shard: int = 1
    gather: Gather = "none"
    states_offloaded: bool = False
    params_offloaded: bool = False
    states_sharded: bool = False
    grads_sharded: bool = False
    flat_states: bool = False
    ddp_buckets: bool = False
    whole_param_states: bool = False
    # DeepSpeed (gpumem_gui.core.training.frameworks.deepspeed): the dtype the engine casts the model to (run
    # without autocast), fp32 master bytes per parameter, the fp32 flat gradient partition the step makes, the
    # IPG reduce bucket (elements; kept for the whole run or only during backward) and a preallocated
    # gradient partition buffer (ZeRO-3)
    model_dtype: str | None = None
    master_bytes: int = 0
    flat_grad_bytes: int = 0
    reduce_bucket: int = 0
    reduce_bucket_persistent: bool = False
    grad_partition_buffer: bool = False
    grads_kept_after_backward: int = 1  # ZeRO-1: the backward epilogue keeps 1/n of the gradients
    # DeepSpeed: the optimizer steps flat partitions, not the parameters (frameworks/deepspeed.py
    # FlatPartitions): None: per-parameter tensors; 0: one per parameter group (stages 1/2); else stage 3's
    # sub_group_size (elements)
    flat_step: int | None = None
    # ZeRO-3 parameter coordinator: (prefetch_bucket, max_live_params, persistence_threshold), elements
    stage3_gather: tuple[int, int, int] | None = None


class Framework(ABC):
    """One training framework; :meth:`selected` picks it from the run's fields."""

    name: str = ""
    source: str = ""

    @abstractmethod
    def selected(self, run: TrainingRun) -> bool:
        """Whether ``run`` uses this framework."""

    @abstractmethod
    def sharding(self, run: TrainingRun) -> Sharding:
        """How one rank's state is divided (see :class:`Sharding`)."""

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        """Framework-specific checks: errors raise :class:`GpumemInputError`, soft problems are returned."""
        return []

    def trainer_args(self, run: TrainingRun) -> list[str]:
        """The framework's part of the Hugging Face ``TrainingArguments`` (none for plain DDP)."""
        return []


def no_param_offload() -> GpumemInputError:
    return GpumemInputError("parameter offload needs ZeRO-3 or FSDP full_shard/hybrid_shard", field="offload")


def nothing_to_shard(ranks: int, engine: str = "") -> list[str]:
    """The warning of a sharded run over one rank (``ranks``: those the states are sharded over, dp x cp
    for ZeRO and FSDP); ``engine``: what the framework still changes then."""
    if ranks == 1:
        return [f"zero/fsdp: with dp=1 there is nothing to shard{engine or '; per-GPU memory is unchanged'}"]
    return []
