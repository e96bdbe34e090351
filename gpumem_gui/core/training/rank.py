"""One rank's training step: the run turned into what the replay takes (the forward's config, the
optimizer options, the framework's hooks), and the replay itself
(:func:`~gpumem_gui.core.replay.step.simulate_step`)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import ceil

from gpumem_gui.core.allocator import parse_alloc_conf, run_events
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.step import StepOptions, StepResult, replayed_microbatches, simulate_step
from gpumem_gui.core.replay.step_tape import simulate_step_taped
from gpumem_gui.core.replay.vision import has_tower, image_tokens
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.parallel import Degrees, rank_spec, stage_layers, weighted_chunk_layers
from gpumem_gui.core.training.buckets import BucketHooks, WholeParams, ZeroHooks
from gpumem_gui.core.training.checks import expert_linears, lora_targets
from gpumem_gui.core.training.frameworks.deepspeed import FlatPartitions
from gpumem_gui.core.training.frameworks.fsdp import fsdp2_hooks
from gpumem_gui.core.training.model_parallel import rank_sharding, tp_fields
from gpumem_gui.core.training.precision import dtypes, precision
from gpumem_gui.core.training.profiles import holds_unsynced_gradients, profile, trick_fields
from gpumem_gui.core.training.run import TrainingRun
from gpumem_gui.core.training.sharding import ShardingHooks


def _quant_bytes(run: TrainingRun, rspec: ModelSpec) -> int:
    """Bytes of the quantized linears on this rank (formats.weight_bytes): 4-bit packed weights + absmax /
    quant state, or int8 weights + fp32 row scales (SCB)."""
    cdt = precision(run).compute_bytes
    experts = run.qlora_experts != "bf16"  # bf16: transformers 5's fused stacks are no Linear4bit
    wb = weight_bytes(rspec, run.qlora_base, compute_dtype_bytes=cdt, quantize_experts=experts)
    return wb.quantized_bytes


def held_layers(spec: ModelSpec, run: TrainingRun, stage: int) -> range | tuple[int, ...]:
    """The layers pipeline stage ``stage`` holds: the framework's uneven chunks under interleaved 1F1B
    where its profile splits that way (torchtitan), else contiguous and even (:func:`stage_layers`)."""
    if run.pp > 1 and run.pp_schedule == "interleaved-1f1b" and profile(run).uneven_pp_split:
        return weighted_chunk_layers(spec.num_layers, run.pp, run.pp_virtual, stage)
    return stage_layers(spec, run.pp, stage)


def step_config(
    spec: ModelSpec, run: TrainingRun, stage: int = 0, shape: TrainingRun | None = None
) -> tuple[ReplayConfig, ModelSpec]:
    """What pipeline stage ``stage`` (one TP rank of it) replays: its forward's config and its slice of the
    model. ``shape``: ``run`` with its point (micro-batch, sequence) set to 1, a key under which all but the
    point's micro-batch and tokens per rank are kept (:func:`_shape_config`)."""
    cfg, rspec = _config(spec, run, stage) if shape is None else _shape_config(spec, shape, stage)
    return replace(cfg, batch=run.batch, q=_tokens_per_rank(spec, run)), rspec


def _tokens_per_rank(spec: ModelSpec, run: TrainingRun) -> int:
    """The tokens of one sequence on a rank: the sequence and its images' tokens (replay/vision.py, joining
    every sequence) over the context-parallel degree."""
    image_tok = image_tokens(spec, run.images, run.image_size) if has_tower(spec) else 0
    return ceil((run.seq + image_tok) / run.cp)


@lru_cache(maxsize=256)
def _shape_config(spec: ModelSpec, shape: TrainingRun, stage: int) -> tuple[ReplayConfig, ModelSpec]:
    return _config(spec, shape, stage)


def _adapter_dtype(run: TrainingRun, param_dt: str) -> str:
    """LoRA adapters' dtype: like the base under FSDP mixed precision or where the framework builds them in
    the model's dtype (:attr:`Profile.lora_model_dtype`), else PEFT's fp32."""
    if precision(run).store_scale != 1:
        return "bf16"
    return param_dt if profile(run).lora_model_dtype else "f32"


def _config(spec: ModelSpec, run: TrainingRun, stage: int) -> tuple[ReplayConfig, ModelSpec]:
    layers = held_layers(spec, run, stage)
    rspec = rank_spec(
        spec, Degrees(tp=run.tp, pp=run.pp, ep=run.ep), stage, None if isinstance(layers, range) else layers
    )
    param_dt, autocast = dtypes(run)
    mdt = rank_sharding(run).model_dtype
    if mdt is not None:  # DeepSpeed casts the model to its bf16/fp16 dtype and runs it without autocast
        param_dt, autocast = mdt, None
    frozen = sum(1 for i in layers if i < run.frozen_layers)
    # images (replay/vision.py): their tokens join every sequence, the frozen tower runs on the first stage
    image_tok = image_tokens(spec, run.images, run.image_size) if has_tower(spec) else 0
    images = run.images if image_tok and stage == 0 else 0
    cfg = ReplayConfig(
        batch=run.batch,
        q=_tokens_per_rank(spec, run),
        images=images,
        image_size=run.image_size if images else 0,
        train_tower=run.train_vision_tower and images > 0,  # replay/vision_train.py
        tower_targets=run.lora_vision_tower,  # replay/vision_train.py tower_linears
        param_dt=param_dt,
        autocast=autocast,
        attn="sdpa" if run.attn == "flash" else run.attn,
        grad_ckpt=run.grad_ckpt,
        method=run.method,
        lora_rank=run.lora_rank,
        lora_targets=lora_targets(run),
        lora_dropout=run.lora_dropout,
        adapter_dt=mdt or _adapter_dtype(run, param_dt),
        quant_bytes=_quant_bytes(run, rspec) if run.method == "qlora" else 0,
        quant_base=run.qlora_base,
        quant_experts=run.method == "qlora" and run.qlora_experts != "bf16" and run.qlora_base != "int8",
        expert_linears=expert_linears(run),
        frozen_layers=frozen,
        lm_head=stage == run.pp - 1,
        embedding=stage == 0,
        dropout=run.dropout if run.dropout is not None else spec.traits.hidden_dropout,
        attn_dropout=run.dropout if run.dropout is not None else spec.traits.attention_dropout,
        **tp_fields(run),  # type: ignore[arg-type]
        **trick_fields(run),  # type: ignore[arg-type]
    )
    return cfg, rspec


def step_options(run: TrainingRun, dp_rank: int | None = None) -> StepOptions:
    """The optimizer side of the step: accumulation, first step, state sharding and offload, and the
    precision's master weights and fused step. ``dp_rank``: where whole parameters' states go to
    data-parallel ranks, replay that rank (default: the most-loaded)."""
    sh = rank_sharding(run)  # over the dp x cp ranks
    prec = precision(run)
    return StepOptions(
        grad_accum=run.grad_accum,
        first_step=run.first_step,
        state_shard=sh.state_shard,
        offload_states=sh.states_offloaded,
        fused_step=prec.fused_step,
        optimizer_in_backward=run.optimizer_in_backward,
        master_bytes_per_param=max(prec.master_bytes, sh.master_bytes),
        flat_grad_bytes=sh.flat_grad_bytes,
        states_for_unused=sh.flat_states or prec.main_grad,
        owned=WholeParams(run.dp, dp_rank) if sh.whole_param_states else None,
        flat_partitions=None if sh.flat_step is None else FlatPartitions(sh.state_shard, sh.flat_step),
    )


def _zero3_deepspeed(run: TrainingRun) -> bool:
    return run.zero == 3 and run.zero_impl == "deepspeed" and run.dp > 1


def sharding_hooks(run: TrainingRun) -> ShardingHooks:
    """The framework's sharding and the precision's gradient buffers as hooks on the replay (fresh for each
    replay: they hold its gathered units)."""
    sh = rank_sharding(run)  # over the dp x cp ranks
    kw = {
        "param_shard": sh.param_shard,
        "grad_shard": sh.grad_shard,
        "gather": sh.gather,
        "params_offloaded": sh.params_offloaded,
        "grads_dropped": sh.states_offloaded,
        "main_grad": precision(run).main_grad,
        "store_scale": precision(run).store_scale,  # FSDP1 MixedPrecision: fp32 flat shards
        # the 4-bit base sharded (FSDP1; DeepSpeed ZeRO-3: with bnb_4bit_quant_storage=bf16 its partitioner
        # takes the packed weights like any bf16 parameter: HF PEFT docs "DeepSpeed ZeRO-3 + QLoRA",
        # deepspeed/runtime/zero/partition_parameters.py Init._convert_to_deepspeed_param)
        "qlora_sharded": run.method == "qlora" and (run.fsdp != "none" or _zero3_deepspeed(run)),
    }
    # micro-batches without gradient sync before the one that syncs (training/profiles.py)
    unsynced = replayed_microbatches(run.grad_accum) - 1 if holds_unsynced_gradients(run) else 0
    fsdp2 = fsdp2_hooks(run, sh.param_shard, unsynced)  # FSDP2: unit by unit (training/fsdp2.py)
    if fsdp2 is not None:
        return fsdp2  # type: ignore[return-value]
    if sh.ddp_buckets:
        return BucketHooks(run.bucket_cap_mb, run.bucket_view, **kw, unsynced=unsynced)
    if unsynced:
        return ShardingHooks(**kw, unsynced=unsynced)  # type: ignore[arg-type]
    if sh.reduce_bucket or sh.grad_partition_buffer:
        dt_bytes = 4 if sh.model_dtype == "f32" else 2
        return ZeroHooks(
            sh.reduce_bucket * dt_bytes,
            sh.reduce_bucket_persistent,
            dt_bytes if sh.grad_partition_buffer else 0,
            sh.grads_kept_after_backward,
            sh.stage3_gather,
            dt_bytes,
            **kw,
        )
    return ShardingHooks(**kw)  # type: ignore[arg-type]


def simulate_rank(
    spec: ModelSpec, run: TrainingRun, stage: int = 0, cpu_dropout: bool = False, dp_rank: int | None = None
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    """Replay one step of pipeline stage ``stage`` (its TP rank 0). ``cpu_dropout``: replay the CPU dropout
    kernel (a noise tensor of the input's dtype), to compare with measurements made on a CPU; ``dp_rank``:
    as :func:`step_options`."""
    cfg, rspec = step_config(spec, run, stage)
    if cpu_dropout:
        cfg = replace(cfg, cpu_dropout=True)
    record = run.allocator_model
    res = simulate_step(rspec, cfg, run.optimizer, step_options(run, dp_rank), sharding_hooks(run), record)
    return _through_allocator(res, run), cfg, rspec


def _through_allocator(res: StepResult, run: TrainingRun) -> StepResult:
    """The step's allocations and frees (when recorded) through the caching allocator model
    (core/allocator): steady state after a second step, unless the run is the first step itself."""
    if res.events is None:
        return res
    report = run_events(res.events, parse_alloc_conf(run.alloc_conf), steps=1 if run.first_step else 2)
    return replace(res, events=None, allocator=report)


def _taped_rank(
    spec: ModelSpec, run: TrainingRun, stage: int, dp_rank: int | None
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    """:func:`simulate_rank` from the step's tape (:mod:`gpumem_gui.core.replay.step_tape`): one per model
    and run shape, the run's ``batch`` and ``seq`` being the point (``seq`` as the tokens a rank trains);
    more than two micro-batches only repeat the second (the step replays ``min(grad_accum, 2)``, FSDP's
    pipelined units the same: frameworks/fsdp.py), so they share its tape."""
    shape = {"batch": 1, "seq": 1, "grad_accum": replayed_microbatches(run.grad_accum)}
    shape |= {"allocator_model": False, "alloc_conf": ""}  # one tape (with its stream) for either
    shape_run = run.model_copy(update=shape)
    cfg, rspec = step_config(spec, run, stage, shape_run)
    key = (spec, shape_run, stage, dp_rank)
    opts = step_options(run, dp_rank)
    hooks = lambda: sharding_hooks(run)  # noqa: E731
    res = simulate_step_taped(key, rspec, cfg, run.optimizer, opts, hooks, run.allocator_model)
    return _through_allocator(res, run), cfg, rspec


def simulate(
    spec: ModelSpec, run: TrainingRun, stage: int, dp_rank: int | None = None
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    """:func:`simulate_rank`, cached per (spec, run, stage, dp_rank) when the spec is hashable, and a new
    point of a known model and run shape read off the step's tape."""
    try:
        hash(spec)
    except TypeError:  # a spec with an unhashable field: simulate without the cache
        return simulate_rank(spec, run, stage, dp_rank=dp_rank)
    return _simulate_cached(spec, run, stage, dp_rank)


@lru_cache(maxsize=256)
def _simulate_cached(
    spec: ModelSpec, run: TrainingRun, stage: int, dp_rank: int | None
) -> tuple[StepResult, ReplayConfig, ModelSpec]:
    return _taped_rank(spec, run, stage, dp_rank)
