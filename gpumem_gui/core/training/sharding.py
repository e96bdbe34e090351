"""Data-parallel sharding as hooks on the replay: what ZeRO and FSDP change in one rank's step.

* Parameters: each rank stores ``1/param_shard`` of every parameter (ZeRO-3, FSDP), or none of them when they
  are offloaded to the CPU; the full parameters of a *unit* are all-gathered when the forward or the backward
  reaches it: one decoder layer at a time plus the root unit (embeddings, final norm, head), which stays
  gathered for the whole step (FSDP ``FULL_SHARD``, DeepSpeed ZeRO-3), the current and the previous layer in
  backward (``BACKWARD_PRE`` prefetch), or every unit for the whole step (``SHARD_GRAD_OP``). Gathered buffers
  are capped so that sharded + gathered never exceeds the unsharded model.
* Gradients: reduce-scattered as they appear, each rank keeping ``1/grad_shard`` (ZeRO-2/3, FSDP); dropped
  from the GPU when the optimizer runs on the CPU (offload) or when a preallocated fp32 ``main_grad`` buffer
  takes them (Megatron-LM's ``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer``).
* FSDP1 ``no_sync()`` (``unsynced``: the micro-batches replayed under it before the one that syncs): the
  post-backward hook skips the reduce-scatter (``_runtime_utils.py`` ``_post_backward_hook``: ``if not
  state._sync_gradients: return``), so ``flat_param.grad`` stays the unsharded gradient in the dtype autograd
  made it (the compute dtype under ``MixedPrecision``), later micro-batches add into it in place
  (``FlatParamHandle.prepare_gradient_for_backward`` keeps an unsharded ``.grad``), and with CPU offload it
  stays on the GPU ("only offloaded right after the eventual sync", ``FullyShardedDataParallel.no_sync``). The
  micro-batch that syncs reduce-scatters each accumulated gradient and frees it (``_reduce_grad``:
  ``flat_param.grad = None``); like every gradient here, per parameter rather than per unit. DDP with
  ``gradient_as_bucket_view`` the same way: each ``.grad`` (None after ``zero_grad``) is its own tensor until
  the sync copies it into its bucket and points it there (``reducer.cpp`` ``mark_variable_ready_dense``).

Sources: ``torch/distributed/fsdp`` (FULL_SHARD / SHARD_GRAD_OP, BACKWARD_PRE prefetch), DeepSpeed ZeRO-3
parameter partitioning (``deepspeed/runtime/zero/stage3.py``), Megatron-LM ``optimizer/optimizer.py``.
"""

from __future__ import annotations

from gpumem_gui.core.replay.autograd import Param, Sim
from gpumem_gui.core.replay.memory import Storage
from gpumem_gui.core.replay.step import TrainingHooks


class ShardingHooks(TrainingHooks):
    """One rank's view of a sharded data-parallel step (see the module docstring)."""

    def __init__(
        self,
        param_shard: int = 1,
        grad_shard: int = 1,
        gather: str = "none",
        params_offloaded: bool = False,
        grads_dropped: bool = False,
        main_grad: bool = False,
        store_scale: int = 1,
        qlora_sharded: bool = False,
        unsynced: int = 0,
    ) -> None:
        self.param_shard = param_shard
        self.grad_shard = grad_shard
        self.gather = gather  # none | unit (one layer at a time) | all (every unit for the step)
        self.params_offloaded = params_offloaded
        self.grads_dropped = grads_dropped or main_grad
        self.main_grad = main_grad
        self.unit_full: dict[int, int] = {}  # full bytes of each unit (-1: embeddings, final norm, head)
        self.gathered: dict[int, Storage] = {}
        self._cap: int | None = None
        # FSDP1 MixedPrecision: flat parameters stored at store_scale x the compute dtype's bytes (fp32 shards
        # of bf16 compute), gradients reduced and kept in fp32
        self.store_scale = store_scale
        # QLoRA under FSDP (bnb_4bit_quant_storage=bf16): the packed 4-bit weights are sharded like any
        # parameter (Answer.AI fsdp_qlora; HF PEFT docs "FSDP + QLoRA")
        self.qlora_sharded = qlora_sharded
        self.packed = 0
        self.unsynced = unsynced  # FSDP1 no_sync(): micro-batches replayed without gradient sync
        self.microbatch = 0
        self.unsynced_grads: dict[int, Storage] = {}  # id(param) -> its gradient accumulated under no_sync

    @property
    def _active(self) -> bool:
        return self.gather != "none" and (self.param_shard > 1 or self.params_offloaded)

    def param_bytes(self, full_bytes: int, layer: int | None) -> int:
        unit = layer if layer is not None else -1
        self.unit_full[unit] = self.unit_full.get(unit, 0) + full_bytes
        return 0 if self.params_offloaded else -(-full_bytes * self.store_scale // self.param_shard)

    def param_made(self, sim: Sim, p: Param) -> None:
        if self.store_scale != 1:
            p.dt = "f32"  # the optimizer steps the fp32 shards
        if not self.qlora_sharded:
            return
        if p.name == "bnb 4-bit linears":  # what is left whole on every rank: the quantization state
            p.st.grow(max(0, p.full_bytes - self.packed) - p.st.nbytes)
        elif p.full_bytes == 0 and p.numel and p.layer is not None:  # a 4-bit linear: numel / 2 packed bytes
            packed = p.numel // 2
            self.packed += packed
            self.unit_full[p.layer] = self.unit_full.get(p.layer, 0) + packed
            p.st.grow((0 if self.params_offloaded else -(-packed // self.param_shard)) - p.st.nbytes)

    def _gather_cap(self) -> int:
        if self._cap is None:
            total = sum(self.unit_full.values())
            kept = (
                0
                if self.params_offloaded
                else sum(-(-b // self.param_shard) for b in self.unit_full.values())
            )
            self._cap = total - kept
        return self._cap

    def _gather(self, sim: Sim, want: tuple[int, ...]) -> None:
        want = tuple(u for u in want if u in self.unit_full)
        for u in list(self.gathered):
            if u not in want:
                del self.gathered[u]
        for u in want:
            if u in self.gathered:
                continue
            live = sum(st.nbytes for st in self.gathered.values())
            n = max(0, min(self.unit_full[u], self._gather_cap() - live))
            self.gathered[u] = sim.storage(n, "gathered parameters", "param")

    def begin_microbatch(self, sim: Sim) -> None:
        self.microbatch += 1
        if not self._active:
            return
        if self.gather == "all":
            sim.unit = None
            self._gather(sim, tuple(sorted(self.unit_full)))
        else:
            sim.unit = -1
            self._gather(sim, (-1,))

    def enter_unit(self, sim: Sim, unit: int | None, prefetch: tuple[int, ...] = ()) -> None:
        sim.unit = unit
        if self._active and self.gather == "unit" and unit is not None:
            self._gather(sim, (unit, *prefetch))

    def release_units(self, sim: Sim) -> None:
        self.gathered.clear()
        sim.unit = None

    def gradient_ready(self, sim: Sim, p: Param, g: Storage) -> None:
        if 0 < self.microbatch <= self.unsynced:  # no_sync(): kept unsharded (on the GPU even with offload)
            if id(p) not in self.unsynced_grads:  # later micro-batches add into it in place
                whole = self.grad_shard == 1 and self.store_scale == 1  # DDP: .grad beside its bucket
                sim.tr.retag(g, "grad", "gradients" if whole else "unsharded gradients")
                self.unsynced_grads[id(p)] = g
            return
        self._sync(sim, p, g)
        self.unsynced_grads.pop(id(p), None)  # the accumulated gradient, reduce-scattered, is freed

    def _sync(self, sim: Sim, p: Param, g: Storage) -> None:
        if self.grads_dropped:
            return  # added into the main_grad buffer, or copied to the CPU: dropped on the GPU
        if p.grad is not None:
            return  # .grad += g in place (gradient accumulation)
        if self.grad_shard > 1 or self.store_scale != 1:
            p.grad = sim.storage(-(-g.nbytes * self.store_scale // self.grad_shard), "gradients", "grad")
        else:
            sim.tr.retag(g, "grad", "gradients")
            p.grad = g

    def grad_buffers(self, sim: Sim, trainable_params: int) -> Storage | None:
        if not self.main_grad:
            return None
        return sim.storage(4 * trainable_params // max(1, self.grad_shard), "gradients", "grad")
