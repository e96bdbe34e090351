"""DeepSpeed ZeRO (``zero_impl = deepspeed``): stage 1 shards the optimizer states over the data-parallel
ranks, stage 2 the gradients too (reduce-scattered as they appear), stage 3 the parameters too (one layer
gathered at a time, the root unit for the whole step); ``offload_optimizer`` keeps states on the CPU or NVMe
(the CPU Adam reads gradients there), ``offload_param`` (ZeRO-3) the parameters. ZeRO paper (Rajbhandari et
al. 2020).

What the engine and its optimizers allocate, from DeepSpeed's source (``deepspeed/runtime``):

* the model dtype: with ``bf16.enabled`` (what HF Trainer's ``bf16=True`` sets through ``"auto"``) or
  ``fp16.enabled`` the engine casts the module to that dtype and runs it without autocast (``engine.py``
  ``_configure_distributed_model``: ``self.module.bfloat16()`` / ``.half()``): weights, activations and
  gradients are 16-bit;
* fp32 master weights: stages 1/2 clone this rank's flat partition to fp32 whatever the model dtype
  (``zero/stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``: ``single_partition_of_fp32_groups``,
  ``.detach().clone().to(master_weights_and_grads_dtype)``); stage 3 clones it unless the model is already
  fp32 (``zero/stage3.py`` ``_create_fp32_partitions``); the optimizer's states are made on these fp32
  partitions, so they are fp32 too;
* the IPG reduce bucket: ``reduce_bucket_size`` elements in the model dtype, with ``contiguous_gradients``
  (default True): stages 1/2 make it when backward's first gradient arrives and free it at the epilogue
  (``stage_1_and_2.py`` ``setup_buckets`` / ``_release_ipg_buffers``), stage 3 keeps it from setup
  (``stage3.py`` ``_setup_for_real_optimizer``);
* stage 3's gradient partitions: one flat buffer of this rank's partition in the gradient accumulation dtype
  (the model dtype by default), made at setup (``stage3.py`` ``grad_partitions_flat_buffer``);
* stage 1: the gradients build up whole in backward; its epilogue clears every ``.grad`` and keeps only those
  of this rank's partition for the step (``stage_1_and_2.py`` ``independent_gradient_partition_epilogue``:
  ``averaged_gradients`` from ``get_all_grad_tensors(params_in_partition)``, then ``_clear_param_grad_only``);
* the step: the gradient partition flattened and cast to fp32 for the fp32 master (``stage_1_and_2.py``
  ``step``: ``single_partition_of_fp32_groups[i].grad = flat_grad_partition.to(...)``; ``stage3.py``
  ``_prepare_fp32_grad_for_sub_group``);
* stage 3's parameter coordinator: a submodule's parameters are gathered when it runs and released after;
  parameters of at most ``stage3_param_persistence_threshold`` elements stay gathered for good beside their
  partition (``zero/parameter_offload.py`` ``mark_persistent_parameters``: ``ds_numel <= param_threshold``);
  the parameters that come next are prefetched up to ``stage3_prefetch_bucket_size`` elements, and no more
  than ``stage3_max_live_parameters`` are gathered at once (``zero/partitioned_param_coordinator.py``
  ``fetch_sub_module``). Here a decoder layer is one submodule step, and the embeddings, final norm and head
  are gathered when they run;
* the step's optimizer: DeepSpeed hands the wrapped optimizer ONE flat tensor per parameter group, this
  rank's fp32 partition (``stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``: ``param_group['params'] =
  [self.single_partition_of_fp32_groups[i]]``, stepped one group at a time by ``_optimizer_step``), or with
  stage 3 one per sub-group, stepped one after another with its own fp32 gradient (``stage3.py`` ``step``:
  ``_prepare_sub_group`` / ``_optimizer_step`` / ``_release_sub_group``); a torch optimizer's temporaries
  are then made over the whole partition (:class:`FlatPartitions`);
* after the step, stages 1/2 all-gather the updated 16-bit partitions in place into the flat buffer
  (``runtime/utils.py`` ``all_gather_dp_groups`` -> ``all_gather_into_tensor``, or narrowed views of it in
  ``allgather_bucket_size`` chunks): no extra memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.replay.autograd import Param
from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.training.frameworks.base import Framework, Sharding, no_param_offload, nothing_to_shard
from gpumem_gui.core.training.run import TrainingRun

# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig.sub_group_size (elements; stage 3)
SUB_GROUP = 1_000_000_000
# deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__: nccl_start_alignment_factor = 2
# (4-byte alignment / sizeof(fp16)); each group's flat buffer is padded to a multiple of it x dp
_NCCL_ALIGN = 2

# the precision a run names -> the dtype DeepSpeed's engine casts the model to (bf16 / fp16 enabled)
_MODEL_DTYPE = {"amp-bf16": "bf16", "mp-bf16": "bf16", "bf16": "bf16", "amp-fp16": "f16", "fp32": "f32"}


def model_dtype(run: TrainingRun) -> str | None:
    """The dtype DeepSpeed runs the model in (None: the run's own precision profile applies: QLoRA's 4-bit
    base, Megatron's optimizer)."""
    if run.method == "qlora":
        return None
    return _MODEL_DTYPE.get(run.precision)


@dataclass(frozen=True)
class FlatPartitions:
    """The flat tensors DeepSpeed's ZeRO optimizer steps on one rank, one after another: their element counts.

    * stages 1/2 (``sub_group`` 0): one per parameter group, its ``len(bit16_groups_flat[i]) / dp``
      elements, the group flattened and padded to a multiple of ``nccl_start_alignment_factor x dp``
      (``stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``: ``flatten_dense_tensors_aligned``,
      ``partition_size``);
    * stage 3: the group's parameters in order, each contributing its partition of ``ceil(numel / dp)``
      elements (``partition_parameters.py`` ``_aligned_size`` / ``_padding_size``), cut into sub-groups
      once one holds at least ``sub_group_size`` elements (``stage3.py`` ``_create_fp16_sub_groups``).

    The replayed parameters are one parameter group (the HF Trainer's weight-decay split moves only norms
    and biases to a second, small group)."""

    shard: int
    sub_group: int = 0

    def __call__(self, params: list[Param]) -> list[int]:
        if not self.sub_group:
            align = _NCCL_ALIGN * self.shard
            padded = -(-sum(p.numel for p in params) // align) * align
            return [padded // self.shard] if padded else []
        groups: list[int] = []
        acc = 0
        for i, p in enumerate(params):
            acc += -(-p.numel // self.shard)
            if acc >= self.sub_group or i == len(params) - 1:
                groups.append(acc)
                acc = 0
        return groups


class DeepSpeed(Framework):
    name = "deepspeed"
    source = "deepspeed/runtime/zero (stage_1_and_2.py, stage3.py)"

    def selected(self, run: TrainingRun) -> bool:
        return run.zero > 0 and run.zero_impl == "deepspeed"

    def sharding(self, run: TrainingRun) -> Sharding:
        z, dp = run.zero, run.dp
        offload_params = run.offload == "optimizer+params"
        gather = "unit" if z >= 3 and dp > 1 else "none"
        mdt = model_dtype(run)
        offloaded = run.offload != "none"
        # the fp32 master clone (stage 3 shares an fp32 model's partition instead); offloaded: on the CPU
        master = 0 if mdt is None or offloaded or (z >= 3 and mdt == "f32") else 4
        return Sharding(
            state_shard=dp,
            grad_shard=dp if z >= 2 else 1,
            param_shard=dp if z >= 3 else 1,
            gather="unit" if offload_params else gather,
            states_offloaded=offloaded,
            params_offloaded=offload_params,
            states_sharded=True,
            grads_sharded=z >= 2,
            flat_states=True,
            flat_step=SUB_GROUP if z >= 3 else 0,
            model_dtype=mdt,
            master_bytes=master,
            flat_grad_bytes=0 if mdt is None or offloaded else 4,
            reduce_bucket=run.reduce_bucket if mdt is not None else 0,
            reduce_bucket_persistent=z >= 3,
            grad_partition_buffer=z >= 3 and mdt is not None and not offloaded,
            grads_kept_after_backward=dp if z == 1 and mdt is not None and not offloaded else 1,
            stage3_gather=(run.prefetch_bucket, run.max_live_params, run.persistence_threshold)
            if z >= 3 and mdt is not None
            else None,
        )

    def check(self, spec: ModelSpec, run: TrainingRun) -> list[str]:
        if run.offload == "optimizer+params" and run.zero != 3:
            raise no_param_offload()
        engine = (
            f"; DeepSpeed's engine still runs the model in {model_dtype(run)} with fp32 master weights "
            "and its reduce bucket"
            if model_dtype(run)
            else ""
        )
        return nothing_to_shard(run.dp, engine)  # run: the dp x cp view (training/checks.py)

    def trainer_args(self, run: TrainingRun) -> list[str]:
        offload = {
            "optimizer": f", offload_optimizer={run.offload_device}",
            "optimizer+params": f", offload_optimizer+param={run.offload_device}",
        }
        return [f"deepspeed='ds_zero{run.zero}.json'  # ZeRO stage {run.zero}{offload.get(run.offload, '')}"]


DEEPSPEED = DeepSpeed()


GRADS_SOURCE = (
    "deepspeed/runtime/zero/stage_1_and_2.py (ZeRO-1: independent_gradient_partition_epilogue keeps this "
    "rank's partition; ZeRO-2: grads_in_partition), deepspeed/runtime/zero/stage3.py "
    "(grad_partitions_flat_buffer, made at setup)"
)
MASTER_SOURCE = (
    "deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ "
    "(single_partition_of_fp32_groups: this rank's flat partition cloned to fp32); "
    "deepspeed/runtime/zero/stage3.py _create_fp32_partitions"
)
FLAT_STEP_WHAT = (
    "DeepSpeed hands the optimizer one flat fp32 tensor per parameter group (ZeRO-3: per sub-group of "
    "sub_group_size elements), this rank's partition: 'a parameter' above is that whole 1-D partition"
)
FLAT_STEP_SOURCE = (
    "deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ (param_group['params'] = "
    "[single_partition_of_fp32_groups[i]]); deepspeed/runtime/zero/stage3.py _optimizer_step ([fp32_param] "
    "per sub-group), _create_fp16_sub_groups"
)
_ZERO_WHAT = {
    "reduce bucket": (
        "reduce_bucket elements x bytes of the model dtype: the IPG bucket gradients are copied into for "
        "their reduction (contiguous_gradients); stages 1/2: from backward's first gradient to its end, "
        "stage 3: for the whole run",
        "deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.setup_buckets / "
        "_release_ipg_buffers; "
        "deepspeed/runtime/zero/stage3.py _setup_for_real_optimizer (ipg_buckets)",
    ),
    "fp32 gradient partition": (
        "4 B x this rank's trainable parameters / data-parallel ranks: the gradient partition flattened and "
        "cast to fp32 for the fp32 master step, during optimizer.step() (while it is cast, + the flattened "
        "16-bit copy it is cast from); one parameter group (ZeRO-3: sub-group of sub_group_size elements) at "
        "a time",
        "deepspeed/runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.step (single_partition_of_fp32_groups"
        "[i].grad = self.flatten(self.averaged_gradients[i]).to(...)); deepspeed/runtime/zero/stage3.py "
        "_prepare_fp32_grad_for_sub_group; torch/_utils.py _flatten_dense_tensors (torch.cat)",
    ),
}


def zero_explanation(
    tag: str, run: TrainingRun, trainable_params: int, base: dict[str, object]
) -> Explanation:
    """The explanation of a DeepSpeed ZeRO buffer (``reduce bucket``, ``fp32 gradient partition``)."""
    formula, source = _ZERO_WHAT[tag]
    return Explanation(
        formula=formula,
        inputs={
            **base,
            "zero": run.zero,
            "dp": run.dp,
            "reduce_bucket": run.reduce_bucket,
            "model_dtype": model_dtype(run) or "",
            "trainable_params": trainable_params,
        },
        source=source,
    )
