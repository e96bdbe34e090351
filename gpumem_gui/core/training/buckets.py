"""Data-parallel wrappers' own buffers and partitions, as the replay meets them.

* ``DistributedDataParallel``'s reducer (``torch/csrc/distributed/c10d/reducer.cpp``
  ``Reducer::initialize_buckets``) allocates, when the wrapper is built, one flat tensor per bucket holding
  the gradients of its parameters in their dtype: every trainable parameter once, so the buckets together are
  the size of all gradients, whatever ``bucket_cap_mb`` (which only decides how many buckets there are; the
  first one after the one-time rebuild is capped at ``_DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB when
  ``bucket_cap_mb`` is left at its default, ``torch/nn/parallel/distributed.py`` ``_BucketCapacityConfig``).
  ``gradient_as_bucket_view=False`` (torch's default): each ``.grad`` is a tensor of its own and the reducer
  copies it into its bucket (``Reducer::mark_variable_ready_dense``, ``bucket_view.copy_(grad)``), so the
  gradients exist twice. ``True``: ``.grad`` is pointed at its bucket view (``grad = bucket_view``) and the
  gradient autograd made is freed: one copy.
* ``torch.distributed.optim.ZeroRedundancyOptimizer`` (``zero_redundancy_optimizer.py``
  ``_partition_parameters``): whole parameters are assigned to ranks, largest first, each to the rank with
  the fewest elements so far; a rank keeps optimizer states only for its own parameters. The rank with the
  most elements decides the fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.replay.autograd import Param, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage
from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.training.run import TrainingRun
from gpumem_gui.core.training.sharding import ShardingHooks

BUCKETS_SOURCE = (
    "torch/csrc/distributed/c10d/reducer.cpp (Reducer::initialize_buckets, mark_variable_ready_dense); "
    "torch/nn/parallel/distributed.py (_BucketCapacityConfig, gradient_as_bucket_view)"
)
ZERO_TORCH_SOURCE = (
    "torch/distributed/optim/zero_redundancy_optimizer.py (ZeroRedundancyOptimizer._partition_parameters: "
    "sorted by numel, largest first, each to the rank with the smallest total)"
)


class BucketHooks(ShardingHooks):
    """A DDP rank: the reducer's flat gradient buckets, allocated before the first forward and alive for the
    whole run; with ``bucket_view`` the gradients live in them (``grad_buffers``), otherwise they are a
    second copy of every gradient beside ``.grad``."""

    def __init__(self, bucket_cap_mb: float, bucket_view: bool, **sharding: object) -> None:
        super().__init__(**sharding)  # type: ignore[arg-type]
        self.bucket_cap_mb = bucket_cap_mb
        self.bucket_view = bucket_view
        self.buckets: list[Storage] = []

    def grad_buffers(self, sim: Sim, trainable_params: int) -> Storage | None:
        by_dt: dict[str, list[int]] = {}
        for p in sim.params:  # every parameter that requires a gradient, used in the step or not
            if p.rg:
                by_dt.setdefault(p.dt, []).append(round(p.numel * DT_BYTES[p.dt]))
        tag = "gradients" if self.bucket_view else "gradient buckets"
        # one storage for the buckets of every dtype: their bytes add up, how they are split changes nothing
        self.buckets = [sim.storage(sum(sum(v) for v in by_dt.values()), tag, "grad")]
        if self.bucket_view:
            self.grads_dropped = True  # .grad is a view of its bucket: the gradient autograd made is freed
            return self.buckets[0]
        return super().grad_buffers(sim, trainable_params)


@dataclass(frozen=True)
class WholeParams:
    """ZeroRedundancyOptimizer's partition over ``world`` ranks, seen from its most-loaded rank (the lowest
    such rank on a tie), or from ``rank`` when given: ``(rank, its parameters)``."""

    world: int
    rank: int | None = None

    def __call__(self, params: list[Param]) -> tuple[int, list[Param]]:
        owned = greedy_partition([p.numel for p in params], self.world)
        sizes = [sum(params[i].numel for i in r) for r in owned]
        rank = self.rank if self.rank is not None else max(range(self.world), key=lambda r: (sizes[r], -r))
        return rank, [params[i] for i in owned[rank]]


def greedy_partition(numels: list[int], world: int) -> list[list[int]]:
    """Indices of ``numels`` per rank: largest first (a stable sort), each to the first rank with the
    smallest total so far (ZeroRedundancyOptimizer._partition_parameters, _get_min_index)."""
    sizes = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(numels)), key=lambda j: numels[j], reverse=True):
        r = min(range(world), key=lambda k: (sizes[k], k))
        out[r].append(i)
        sizes[r] += numels[i]
    return out


def bucket_explanation(run: TrainingRun, trainable_params: int, base: dict[str, object]) -> Explanation:
    """The reducer's buckets as a second copy of the gradients (``gradient_as_bucket_view=False``)."""
    return Explanation(
        formula="DDP reducer buckets: one flat copy of every trainable parameter's gradient in its dtype "
        "(the reducer copies each .grad into its bucket for the all-reduce); allocated when "
        "DistributedDataParallel is built and alive for the whole run; bucket_cap_mb only sets how many "
        "buckets hold them",
        inputs={
            **base,
            "dp": run.dp,
            "trainable_params": trainable_params,
            "bucket_cap_mb": run.bucket_cap_mb,
            "bucket_view": run.bucket_view,
        },
        source=BUCKETS_SOURCE,
    )


def owner_text(owner: tuple[int, int, int] | None, dp: int) -> str:
    """'; whole parameters per rank: rank 0 of 8 holds 27.6 % of them' for the states' formula (the
    estimate's rank is the most-loaded; the per-rank table replays the others)."""
    if owner is None:
        return ""
    rank, held, total = owner
    return (
        f"; whole parameters per rank (ZeroRedundancyOptimizer, greedy by size): rank {rank} of {dp} "
        f"holds the states of {held:,} of {total:,} trainable parameters "
        f"({held / max(1, total):.1%}, an even split would be {1 / dp:.1%})"
    )


class ZeroHooks(ShardingHooks):
    """A DeepSpeed ZeRO rank (:mod:`gpumem_gui.core.training.frameworks.deepspeed`): the IPG reduce bucket
    (``bucket_bytes``; for the whole run at stage 3, else from backward's first gradient to its end) and, at
    stage 3, the flat gradient partition buffer made at setup (``partition_dt_bytes`` per element, the
    gradients themselves dropped once copied into it)."""

    def __init__(
        self,
        bucket_bytes: int,
        persistent: bool,
        partition_dt_bytes: int,
        kept: int = 1,
        stage3: tuple[int, int, int] | None = None,
        dt_bytes: int = 2,
        **sharding: object,
    ) -> None:
        super().__init__(**sharding)  # type: ignore[arg-type]
        self.stage3 = stage3  # (prefetch_bucket, max_live_params, persistence_threshold) in elements
        self.dt_bytes = dt_bytes
        self.bucket_bytes = bucket_bytes
        self.persistent = persistent
        self.partition_dt_bytes = partition_dt_bytes
        self.kept = kept  # ZeRO-1: after backward only this rank's 1/kept of the gradients stays
        self.bucket: Storage | None = None
        self.held: Storage | None = None

    def grad_buffers(self, sim: Sim, trainable_params: int) -> Storage | None:
        if self.persistent and self.bucket_bytes:
            self.bucket = sim.storage(self.bucket_bytes, "reduce bucket", "grad")
        if self.partition_dt_bytes:
            self.grads_dropped = True  # copied into this rank's partition of the flat buffer, then freed
            n = -(-trainable_params // max(1, self.grad_shard))
            return sim.storage(self.partition_dt_bytes * n, "gradients", "grad")
        return super().grad_buffers(sim, trainable_params)

    def gradient_ready(self, sim: Sim, p: Param, g: Storage) -> None:
        if self.bucket is None and self.bucket_bytes:
            self.bucket = sim.storage(self.bucket_bytes, "reduce bucket", "grad")
        super().gradient_ready(sim, p, g)

    def release_units(self, sim: Sim) -> None:
        super().release_units(sim)
        if not self.persistent:
            self.bucket = None  # _release_ipg_buffers at the backward epilogue
        if self.kept > 1:  # every .grad cleared, this rank's partition kept (accumulated in place)
            grads = [p for p in sim.params if p.grad is not None]
            total = sum(p.grad.nbytes for p in grads if p.grad is not None)
            for p in grads:
                p.grad = None
            if self.held is None:  # (views of the partition's gradients: no copy, so made once they are gone)
                self.held = sim.storage(-(-total // self.kept), "gradients", "grad")

    def param_bytes(self, full_bytes: int, layer: int | None) -> int:
        if self.stage3 is not None and self.param_shard > 1 and full_bytes <= self.stage3[2] * self.dt_bytes:
            # ds_persist: gathered for good beside its partition, never gathered per unit
            return full_bytes + (0 if self.params_offloaded else -(-full_bytes // self.param_shard))
        return super().param_bytes(full_bytes, layer)

    def begin_microbatch(self, sim: Sim) -> None:
        super().begin_microbatch(sim)  # the embeddings, gathered as the forward starts with them

    def enter_unit(self, sim: Sim, unit: int | None, prefetch: tuple[int, ...] = ()) -> None:
        if self.stage3 is None or unit is None or not self._active or self.gather != "unit":
            super().enter_unit(sim, unit, prefetch)
            return
        sim.unit = unit
        self._gather(sim, (unit,))  # the previous unit released (the root too: gathered when it runs)
        # forward passes the root as "prefetch" (it stays gathered under FSDP); DeepSpeed prefetches the
        # unit that runs next: the following layer in forward, the one before in backward
        nxt = unit + 1 if prefetch in ((), (-1,)) else prefetch[0]
        if unit < 0 or nxt not in self.unit_full:
            return
        prefetch_bucket, max_live, _ = self.stage3
        # a unit whose parameters all persist (below the threshold) gathers nothing
        room = max(0, max_live * self.dt_bytes - self.unit_full.get(unit, 0))
        n = min(prefetch_bucket * self.dt_bytes, self.unit_full[nxt], room)
        if n:
            self.gathered[-2] = sim.storage(n, "gathered parameters", "param")  # prefetched, in flight
