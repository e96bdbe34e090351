"""Issue 31 item 4: gradient accumulation without gradient sync until the last micro-batch (FSDP1
``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``, as the HF Trainer runs it through accelerate).

With FSDP each rank then keeps every unit's unsharded gradients across the micro-batches: FSDP1 in the dtype
autograd made them (``_runtime_utils.py`` ``_post_backward_hook`` returns before the reduce-scatter), FSDP2
upcast to the reduce dtype (``_fsdp_param.py`` ``to_accumulated_grad_if_needed``); the micro-batch that syncs
reduce-scatters them, so the optimizer step is the same as with a sync on every micro-batch. DDP's gradients
are whole either way; DeepSpeed ZeRO accumulates its own way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpumem_gui.core import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.step import StepResult, simulate_step
from gpumem_gui.core.training import estimate_training, make_training_run, training_command
from gpumem_gui.core.training.fsdp2 import Fsdp2Hooks
from gpumem_gui.core.training.profiles import holds_unsynced_gradients, resolve, unsynced_accumulation
from gpumem_gui.core.training.rank import sharding_hooks, simulate_rank, step_config, step_options
from gpumem_gui.core.training.run import TrainingRun
from tests.conftest import REPO

SPEC = spec_from_config(
    json.loads((REPO / "tests/reference/extra/configs/synthetic__smollm3-tiny.json").read_text()),
    name="smollm3-tiny",
)
DP = 4
FSDP1 = {"fsdp": "full_shard", "fsdp_version": 1, "dp": DP, "batch": 2, "seq": 64}
FSDP2_MP = {"fsdp": "full_shard", "fsdp_version": 2, "dp": DP, "precision": "mp-bf16", "batch": 2, "seq": 64}


def _run(**kw: Any) -> TrainingRun:
    return make_training_run(**kw)


def _step(run: TrainingRun) -> tuple[StepResult, Any]:
    """The step and the hooks that replayed it (their units and parameters)."""
    cfg, rspec = step_config(SPEC, run)
    hooks = sharding_hooks(run)
    return simulate_step(rspec, cfg, run.optimizer, step_options(run), hooks), hooks


def _tag(res: StepResult, phase: str, tag: str) -> int:
    return res.phases[phase].by_tag.get(tag, 0)


def _same_optimizer_step(a: StepResult, b: StepResult) -> None:
    """The optimizer phase's peak, by kind and by tag (tags with bytes), and where it was, equal."""
    pa, pb = a.phases["optimizer"], b.phases["optimizer"]
    assert (pa.total, pa.by_kind, pa.where) == (pb.total, pb.by_kind, pb.where)
    assert {k: v for k, v in pa.by_tag.items() if v} == {k: v for k, v in pb.by_tag.items() if v}


def test_fsdp1_no_sync_keeps_the_unsharded_gradients_at_the_byte() -> None:
    """amp-bf16 (fp32 flat parameters) over 4 ranks: under no_sync the second micro-batch's forward runs with
    every trainable parameter's whole fp32 gradient (4 bytes x numel) instead of its 1/4 shard (numel bytes);
    the step after the sync is the same."""
    each, _ = _step(_run(**FSDP1, grad_accum=2, grad_sync="each"))
    last, _ = _step(_run(**FSDP1, grad_accum=2, grad_sync="last"))
    n = each.trainable_params
    assert _tag(last, "forward", "unsharded gradients") == 4 * n
    assert _tag(each, "forward", "unsharded gradients") == 0
    assert _tag(each, "forward", "gradients") == n  # 4 * numel / 4 ranks, exact for these shapes
    assert _tag(last, "forward", "gradients") == 0  # no shard exists before the sync
    assert last.after_forward - each.after_forward == 4 * n - n
    assert last.phases["forward"].total - each.phases["forward"].total == 3 * n
    _same_optimizer_step(last, each)
    assert last.grad_bytes == each.grad_bytes == n


def test_fsdp1_no_sync_in_mixed_precision_keeps_the_compute_dtype() -> None:
    """MixedPrecision(param_dtype=bf16): flat_param.grad stays the bf16 gradient autograd made (2 bytes x
    numel) until the sync casts and reduce-scatters it into fp32 shards."""
    run = _run(**{**FSDP1, "precision": "mp-bf16"}, grad_accum=2, grad_sync="last")
    res, _ = _step(run)
    assert _tag(res, "forward", "unsharded gradients") == 2 * res.trainable_params
    assert res.grad_bytes == 4 * res.trainable_params // DP


def _unsharded_fp32(hooks: Fsdp2Hooks) -> int:
    """Every trainable unit's padded unsharded gradients in fp32 (the reduce dtype): 4 x ceil(numel / dp) x dp
    per parameter."""
    return sum(
        4 * -(-p.numel // DP) * DP for unit in hooks.units.values() for p in unit.trainable
    )  # fmt: skip


def test_fsdp2_no_sync_accumulates_in_the_reduce_dtype_at_the_byte() -> None:
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): set_requires_gradient_sync(False) keeps each
    unit's gradients unsharded and upcast to fp32 across the micro-batches; with a sync on every micro-batch
    only the fp32 shards (1/4 of that) live across them."""
    each, _ = _step(_run(**FSDP2_MP, grad_accum=2, grad_sync="each"))
    last, hooks = _step(_run(**FSDP2_MP, grad_accum=2, grad_sync="last"))
    full = _unsharded_fp32(hooks)
    assert _tag(last, "forward", "unsharded gradients") == full
    assert _tag(each, "forward", "unsharded gradients") == 0
    assert _tag(each, "forward", "gradients") == full // DP
    assert last.after_forward - each.after_forward == full - full // DP
    _same_optimizer_step(last, each)
    assert last.grad_bytes == each.grad_bytes == full // DP


def test_fsdp2_no_sync_reshards_after_backward() -> None:
    """reshard_after_backward stays True under set_requires_gradient_sync(False): after the first micro-batch
    no unit is left gathered (unlike pipelining, which also sets set_reshard_after_backward(False))."""
    run = _run(**FSDP2_MP, grad_accum=2, grad_sync="last")
    cfg, rspec = step_config(SPEC, run)
    hooks = sharding_hooks(run)
    assert isinstance(hooks, Fsdp2Hooks) and hooks.pol.unsynced == 1
    simulate_step(rspec, cfg, run.optimizer, step_options(run), hooks)
    assert not hooks.unsharded and not hooks.acc and not hooks.ugrads.get(-1)


@pytest.mark.parametrize("fields", [FSDP1, FSDP2_MP], ids=["fsdp1", "fsdp2"])
def test_one_micro_batch_has_nothing_to_accumulate_and_eight_repeat_two(fields: dict[str, Any]) -> None:
    """grad_accum 1: sync and no_sync are the same step; grad_accum 8 is grad_accum 2's step (micro-batches
    2 to 7 repeat the second one's forward, and the last one syncs as the second does)."""
    one = {gs: simulate_rank(SPEC, _run(**fields, grad_accum=1, grad_sync=gs))[0] for gs in ("each", "last")}
    assert one["each"] == one["last"]
    for gs in ("each", "last"):
        two = simulate_rank(SPEC, _run(**fields, grad_accum=2, grad_sync=gs))[0]
        eight = simulate_rank(SPEC, _run(**fields, grad_accum=8, grad_sync=gs))[0]
        assert two == eight, gs
    last = simulate_rank(SPEC, _run(**fields, grad_accum=8, grad_sync="last"))[0]
    each = simulate_rank(SPEC, _run(**fields, grad_accum=8, grad_sync="each"))[0]
    assert last.phases["forward"].total > each.phases["forward"].total


def test_ddp_gradients_are_whole_either_way() -> None:
    """DistributedDataParallel.no_sync only skips the bucket all-reduce: .grad is the whole gradient with or
    without it, and the reducer's buckets exist from construction (buckets.py)."""
    each = simulate_rank(SPEC, _run(dp=2, grad_accum=4, grad_sync="each"))[0]
    last = simulate_rank(SPEC, _run(dp=2, grad_accum=4, grad_sync="last"))[0]
    assert each == last


def test_ddp_bucket_views_keep_a_second_copy_under_no_sync() -> None:
    """gradient_as_bucket_view=True with zero_grad(set_to_none=True): a step's fresh .grad is pointed at its
    bucket only by the sync (reducer.cpp mark_variable_ready_dense: 'users may set grad to be None
    after every iteration ... need to copy grads to bucket_view'); under no_sync it stays a tensor of its own
    beside the buckets until the last micro-batch: 4 x numel bytes more (fp32 gradients) in between."""
    fields = {"dp": 2, "grad_accum": 2, "bucket_view": True, "batch": 2, "seq": 64}
    each, _ = _step(_run(**fields, grad_sync="each"))
    last, _ = _step(_run(**fields, grad_sync="last"))
    n = each.trainable_params
    assert last.after_forward - each.after_forward == 4 * n
    assert _tag(last, "forward", "gradients") - _tag(each, "forward", "gradients") == 4 * n
    _same_optimizer_step(last, each)


def test_framework_defaults_and_their_scope() -> None:
    """The HF Trainer family runs no_sync by default (accelerate sync_each_batch=False); torchtitan and
    torchtune sync every micro-batch; it needs FSDP, accumulation and more than one data-parallel rank."""
    for fw in ("hf-trainer", "trl", "axolotl", "llama-factory"):
        assert unsynced_accumulation(_run(framework=fw, **FSDP1, grad_accum=4)), fw
    for fw in ("torchtitan", "torchtune", "pytorch"):
        assert not unsynced_accumulation(_run(framework=fw, **FSDP2_MP, grad_accum=4)), fw
    trainer = {"framework": "hf-trainer", **FSDP1}
    assert not unsynced_accumulation(_run(**trainer, grad_accum=1))
    assert not unsynced_accumulation(_run(**{**trainer, "dp": 1}, grad_accum=4))
    assert not unsynced_accumulation(_run(**trainer, grad_accum=4, grad_sync="each"))
    ddp = _run(framework="hf-trainer", dp=4, grad_accum=4)
    assert unsynced_accumulation(ddp) and not holds_unsynced_gradients(ddp)  # DDP: whole .grad either way
    assert holds_unsynced_gradients(ddp.model_copy(update={"bucket_view": True}))
    assert not unsynced_accumulation(_run(framework="hf-trainer", zero=2, dp=4, grad_accum=4))
    applied = resolve(_run(**trainer, grad_accum=4)).applied
    assert any("last micro-batch only" in a and "sync_each_batch=False" in a for a in applied)
    assert not any(
        "micro-batch" in a for a in resolve(_run(**trainer, grad_accum=4, grad_sync="last")).applied
    )


def test_the_estimate_shows_the_unsharded_gradients() -> None:
    est = estimate_training(SPEC, _run(framework="hf-trainer", **FSDP1, grad_accum=4))
    assert "last micro-batch only" in str(est.facts.get("framework_defaults"))
    held = est.component("unsharded_gradients")
    assert held is not None and 0 < held.bytes <= 4 * simulate_rank(SPEC, _run(**FSDP1))[0].trainable_params
    assert held.explain.formula.startswith("accumulated without gradient sync")
    assert "no_sync" in held.explain.source and held.explain.inputs["grad_accum"] == 4
    # plain PyTorch syncs every micro-batch: a unit's unsharded gradients live only until its post-backward
    synced = estimate_training(SPEC, _run(**FSDP2_MP, grad_accum=4, grad_ckpt=True)).component(
        "unsharded_gradients"
    )
    assert synced is None or not synced.explain.formula.startswith("accumulated")


def test_zero_refuses_no_sync_in_one_line() -> None:
    with pytest.raises(GpumemInputError) as err:
        estimate_training(SPEC, _run(zero=2, dp=4, grad_accum=4, grad_sync="last"))
    assert err.value.field == "grad_sync" and "\n" not in str(err.value)
    # the Trainer's default under DeepSpeed is no no_sync: no error, no change
    base = simulate_rank(SPEC, _run(zero=2, dp=4, grad_accum=4))[0]
    assert simulate_rank(SPEC, _run(framework="hf-trainer", zero=2, dp=4, grad_accum=4))[0] == base


def test_fsdp1_no_sync_keeps_the_gradients_on_the_gpu_under_cpu_offload() -> None:
    """FullyShardedDataParallel.no_sync: 'the gradients will not be offloaded to CPU when inside the context
    manager ... only offloaded right after the eventual sync'."""
    fields = {**FSDP1, "offload": "optimizer+params", "grad_accum": 2}
    last, _ = _step(_run(**fields, grad_sync="last"))
    each, _ = _step(_run(**fields, grad_sync="each"))
    assert _tag(last, "forward", "unsharded gradients") == 4 * last.trainable_params
    assert _tag(each, "forward", "unsharded gradients") == _tag(each, "forward", "gradients") == 0
    assert last.grad_bytes == each.grad_bytes == 0  # after the sync: on the CPU


def test_the_trainer_arguments_name_sync_each_batch() -> None:
    """The run's TrainingArguments ask for a sync on every micro-batch where the run says so."""
    each = training_command("m", _run(**FSDP1, grad_accum=4, grad_sync="each"))
    assert "'sync_each_batch': True" in each
    assert "sync_each_batch" not in training_command("m", _run(**FSDP1, grad_accum=4))
