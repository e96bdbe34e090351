"""The explanations of the FSDP components of a phase (formula, inputs, the torch source line they follow).

``torch/distributed/fsdp/_fully_shard`` of torch 2.13: PG = ``_fsdp_param_group.py``, COLL =
``_fsdp_collectives.py``, PARAM = ``_fsdp_param.py``, STATE = ``_fsdp_state.py``; FSDP1 =
``torch/distributed/fsdp/_runtime_utils.py`` / ``_flat_param.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.training.profiles import fsdp2_units, profile, unsynced_accumulation

if TYPE_CHECKING:
    from gpumem_gui.core.training.run import TrainingRun

# (replay tag, component key, label) of the FSDP2 buffers, in display order after the gathered parameters
FSDP_TAGS = (
    ("all-gather buffers", "all_gather_buffers", "FSDP all-gather buffers"),
    ("resharded parameters", "resharded_parameters", "parameters resharded after forward (1/N)"),
    ("unsharded gradients", "unsharded_gradients", "unsharded gradients (before reduce-scatter)"),
    ("reduce-scatter buffers", "reduce_scatter_buffers", "FSDP reduce-scatter buffer"),
)


def _inputs(run: TrainingRun, base: dict[str, Any]) -> dict[str, Any]:
    return {
        **base,
        "fsdp": run.fsdp,
        "fsdp_version": run.fsdp_version,
        "dp": run.dp,
        "precision": run.precision,
        "reshard_size": run.reshard_size or 0,
        **({} if fsdp2_units(run) == "layers" else {"fsdp_units": fsdp2_units(run)}),
    }


def gathered(run: TrainingRun, base: dict[str, Any]) -> Explanation:
    if run.fsdp != "none" and run.fsdp_version == 2:
        p = profile(run)
        root = (
            "through forward and, regathered at the loss, through backward"
            if p.fsdp2_root_reshard
            else f"from its forward all-gather to its post-backward, never resharded after forward "
            f"({p.fsdp2_root_reshard_source})"
        )
        units = fsdp2_units(run)
        held = {"layers": "embeddings, final norm, head", "embedding": "final norm, head"}.get(
            units, "final norm"
        )
        apart = "" if units == "layers" else f"; {units} units of their own, gathered around each call only"
        return Explanation(
            formula="unsharded parameters (param_dtype: bf16 under mp-bf16) of the units gathered now: the "
            f"root ({held}) {root}; one decoder layer in forward{apart}; every unit until its "
            "post-backward when not resharded after forward (shard_grad_op)",
            inputs=_inputs(run, base),
            source="torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPParamGroup.wait_for_unshard "
            "-> _fsdp_collectives.py foreach_all_gather_copy_out (_fsdp_param.py alloc_all_gather_outputs); "
            "freed by FSDPParamGroup.reshard (post_forward, post_backward)",
        )
    return Explanation(
        formula="full parameters of the gathered FSDP/ZeRO-3 units: the root unit (embeddings, final norm, "
        "head) for the whole step, one decoder layer in forward, the current and the prefetched one in "
        "backward (capped at the unsharded model)",
        inputs={**base, "fsdp": run.fsdp, "zero": run.zero, "dp": run.dp},
        source="torch/distributed/fsdp (FSDP1 FULL_SHARD, BACKWARD_PRE prefetch: _runtime_utils.py "
        "_pre_forward_unshard, _pre_backward_hook); DeepSpeed ZeRO-3 parameter partitioning",
    )


# the FSDP2 buffers' explanations by replay tag: (formula, the torch source it follows)
_TEXTS: dict[str, tuple[str, str]] = {
    "all-gather buffers": (
        # formula
        "flat all-gather output = world x the unit's padded shards in param_dtype: in forward the "
        "previous unit's is kept until the next copy-out and the last one until the root's post-forward; in "
        "backward the prefetched unit's waits until its pre-backward, and a regathered unit's exists next "
        "to its unsharded parameters during the copy-out (the root's at the start of backward); under "
        "mp-bf16 / CPU offload a flat copy-in of the shards comes first",
        # source
        "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather "
        "(all_gather_comm.allocate, _get_param_all_gather_inputs); _fsdp_param_group.py wait_for_unshard "
        "(comm_ctx.all_gather_state), _backward_prefetch; _fsdp_state.py _post_forward",
    ),
    "resharded parameters": (
        # formula
        "reshard_after_forward=N: each unit keeps a clone of 1/N of its unsharded parameters "
        "(param_dtype) from its post-forward to its pre-backward; made in forward, FSDPMemTracker counts it "
        "as an activation",
        # source
        "torch/distributed/fsdp/_fully_shard/_fsdp_param.py FSDPParam.to_sharded_post_forward "
        "(narrow(...).clone()), freed by to_unsharded; _fsdp_init.py _get_post_forward_mesh_info",
    ),
    "unsharded gradients": (
        # formula
        "gradients of the unsharded parameters (param_dtype), one per trainable parameter of the "
        "units in backward, until the unit's post-backward copies them into the reduce-scatter input (the "
        "root's until the end of backward); FSDPMemTracker counts them as temporaries",
        # source
        "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPParamGroup.post_backward "
        "(unsharded_grads), _fsdp_collectives.py foreach_reduce (unsharded_grads.clear())",
    ),
    "reduce-scatter buffers": (
        # formula
        "flat reduce-scatter input = the unit's padded unsharded gradients in reduce_dtype (fp32 "
        "under mp-bf16); the last one is kept until the next unit's post-backward (one buffer in flight), "
        "the root's until the final callback",
        # source
        "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce "
        "(reduce_scatter_comm.allocate); _fsdp_param_group.py post_backward (reduce_scatter_states, "
        "reduce_scatter_max_input_buffers=1); _fsdp_state.py _root_post_backward_final_callback",
    ),
}


# gradient accumulation without sync (training/profiles.py unsynced_accumulation): the same tag, kept longer
_UNSYNCED = (
    # formula
    "accumulated without gradient sync: every trainable parameter's whole (unsharded) gradient stays on each "
    "rank from the first micro-batch to the last one's post-backward, which reduce-scatters it (grad_sync "
    "last: FSDP1 flat_param.grad in the dtype autograd made it, param_dtype under MixedPrecision; FSDP2 "
    "upcast to reduce_dtype after the unit reshards); later micro-batches add into it in place",
    # source
    "torch/distributed/fsdp/_runtime_utils.py _post_backward_hook (returns before the reduce-scatter when "
    "not _sync_gradients), fully_sharded_data_parallel.py FullyShardedDataParallel.no_sync; "
    "_fully_shard/_fsdp_param_group.py post_backward (reduce_grads False), _fsdp_param.py "
    "to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed",
)


def _explained(tag: str) -> Any:
    def explain(run: TrainingRun, base: dict[str, Any]) -> Explanation:
        formula, source = _TEXTS[tag]
        if tag == "unsharded gradients" and unsynced_accumulation(run):
            formula, source = _UNSYNCED
        inputs = _inputs(run, base)
        if tag == "unsharded gradients":
            inputs["grad_accum"] = run.grad_accum
            inputs["grad_sync"] = run.grad_sync
        return Explanation(formula=formula, inputs=inputs, source=source)

    return explain


FSDP_EXPLAIN = {tag: _explained(tag) for tag in _TEXTS}
