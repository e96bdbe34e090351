"""PyTorch FSDP: parameters, gradients and optimizer states sharded over the data-parallel ranks.

* ``fsdp_version = 2`` (default): ``fully_shard`` per decoder layer and on the root, replayed unit by unit by
  :class:`~gpumem_gui.core.training.fsdp2.Fsdp2Hooks` (per-parameter shards, flat all-gather and
  reduce-scatter buffers, backward prefetch, the root regathered in backward unless the framework keeps it
  gathered: ``Profile.fsdp2_root_reshard``, torchtune's root ``reshard_after_forward=False``; ``fsdp_units``:
  the embedding and the head as units of their own, torchtune's ``custom_sharded_layers``). ``full_shard``
  is ``reshard_after_forward=True`` (``reshard_size`` N: an int, a 1/N shard kept after forward),
  ``shard_grad_op`` ``False``, ``hybrid_shard`` shards over a node's ``gpus_per_node`` ranks (HSDP; the
  all-reduce across nodes runs in place on the sharded gradients). ``offload = optimizer+params`` is
  ``CPUOffloadPolicy``: parameters, gradients and the optimizer step on the CPU.
* ``fsdp_version = 1``: ``FullyShardedDataParallel`` (one FlatParameter per unit, ``use_orig_params``),
  replayed by :class:`~gpumem_gui.core.training.sharding.ShardingHooks`: one decoder layer gathered at a time
  plus the root unit for the whole step (``FULL_SHARD``, ``BACKWARD_PRE``), every unit for the step
  (``SHARD_GRAD_OP``); ``CPUOffload(offload_params=True)``.

Sources: ``torch/distributed/fsdp/_fully_shard`` (FSDP2), ``torch/distributed/fsdp/
fully_sharded_data_parallel.py`` and ``_runtime_utils.py`` (FSDP1).
"""

from __future__ import annotations

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.step import replayed_microbatches
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload, nothing_to_shard
from gpumem_gui.core.training.fsdp2 import Fsdp2Hooks, Fsdp2Policy
from gpumem_gui.core.training.precision import precision
from gpumem_gui.core.training.profiles import fsdp2_units, profile
from gpumem_gui.core.training.run import TrainingRun

# the modules each fsdp_units value shards apart (fsdp2.py OWN_UNITS)
_OWN = {"embedding": ("embedding",), "embedding+head": ("embedding", "head")}


def shard_world(run: TrainingRun) -> int:
    """Ranks one unit is sharded over: the data-parallel ranks, a node's GPUs under ``hybrid_shard``."""
    return max(1, min(run.dp, run.gpus_per_node)) if run.fsdp == "hybrid_shard" else run.dp


def fsdp2_hooks(run: TrainingRun, w: int, unsynced: int = 0) -> Fsdp2Hooks | None:
    """The FSDP2 hooks of ``run``, sharding over ``w`` ranks (None: not FSDP2); ``unsynced``: micro-batches
    replayed under ``set_requires_gradient_sync(False)`` before the one that syncs."""
    if run.fsdp == "none" or run.fsdp_version != 2:
        return None
    if run.fsdp == "shard_grad_op" or (run.pp > 1 and run.framework == "torchtitan"):
        # torchtitan under pipelining: reshard_after_forward False "to avoid per-microbatch all-gathers"
        # (torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy "default": not pp_enabled;
        # parallelisms/parallelize_llama.py apply_fsdp at 9dec370)
        reshard = 0
    else:
        # fsdp/_fully_shard/_fsdp_init.py _get_post_forward_mesh_info: an int N is a 1/N post-forward shard,
        # 1 means False and the world size means True
        n = run.reshard_size or w
        reshard = 0 if n == 1 else min(n, w)
    prec = precision(run)
    return Fsdp2Hooks(
        Fsdp2Policy(
            world=w,
            reshard=reshard,
            store_scale=prec.store_scale,
            reduce_bytes=prec.reduce_bytes,
            offload=run.offload == "optimizer+params",
            qlora=run.method == "qlora",
            # torchtune's QLoRA base is torchao's NF4Tensor (torchtune/modules/low_precision/nf4_linear.py,
            # modules/peft/lora.py: to_nf4), which FSDP2 shards whole
            nf4_sharded=run.method == "qlora" and run.framework == "torchtune",
            # torch.distributed.pipelining drives the units: no gradient sync until the last micro-batch
            # (torch/distributed/pipelining/stage.py backward_maybe_with_nosync, perform_reduce_grad)
            pipeline=replayed_microbatches(run.grad_accum) if run.pp > 1 else 0,
            unsynced=unsynced,
            root_reshard=profile(run).fsdp2_root_reshard,
            own_modules=frozenset(_OWN.get(fsdp2_units(run), ())),
        )
    )


def _check_units(spec: ModelSpec, run: TrainingRun) -> None:
    """Modules sharded apart need a decoder whose head is a module with its own weight."""
    if model_kinds(spec).model in ("encoder", "encoder-decoder") or spec.tie_word_embeddings:
        raise GpumemInputError(
            "this model's embedding and head cannot be FSDP units of their own (a head tied to the embedding "
            "reads its weight outside it, as torchtune's TiedLinear does; or not a decoder): use layers",
            field="fsdp_units",
        )


class Fsdp(Framework):
    name = "fsdp"
    source = (
        "torch/distributed/fsdp/_fully_shard (FSDP2 fully_shard); torch/distributed/fsdp/"
        "fully_sharded_data_parallel.py (FSDP1 ShardingStrategy, BackwardPrefetch.BACKWARD_PRE)"
    )

    def selected(self, run: TrainingRun) -> bool:
        return run.fsdp != "none"

    def sharding(self, run: TrainingRun) -> Sharding:
        g = shard_world(run)
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
        if run.reshard_size is not None:
            w = shard_world(run)
            if run.fsdp_version != 2 or run.fsdp != "full_shard":
                raise GpumemInputError(
                    "reshard_size is FSDP2's reshard_after_forward=N: it needs fsdp full_shard and "
                    "fsdp_version 2",
                    field="reshard_size",
                )
            if w % run.reshard_size:
                raise GpumemInputError(
                    f"reshard_size must divide the {w} sharding ranks (1 to {w})", field="reshard_size"
                )
        if run.fsdp_units not in ("auto", "layers"):
            _check_units(spec, run)
        if run.fsdp_version == 2 and shard_world(run) == 1:
            # _fsdp_param_group.py wait_for_unshard, world_size == 1: all_gather_outputs allocated and copied
            return [
                "fsdp: with one rank per shard group there is nothing to shard; FSDP2 still copies each unit "
                "into unsharded parameters as it runs, so per-GPU memory grows"
            ]
        return nothing_to_shard(run.dp)  # run: the dp x cp view (training/checks.py)

    def trainer_args(self, run: TrainingRun) -> list[str]:
        return [f"fsdp='{run.fsdp}'" + (" offload" if run.offload == "optimizer+params" else "")]


FSDP = Fsdp()
