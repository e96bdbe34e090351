"""Drive one training step on the symbolic runtime: forward + loss, backward, optimizer step.

:func:`simulate_step` builds the model's parameters (:mod:`.model`; what each rank stores is the framework
hooks' answer), the optimizer states (:mod:`.optim`; steady state: they exist before the step; first step:
created inside it), runs the micro-batches (the second one, when there is gradient accumulation, with every
``.grad`` already live), then the optimizer step, and returns each phase's peak with what was live at it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from gpumem_gui.core.allocator import AllocatorReport, Event
from gpumem_gui.core.replay import vision, vision_train
from gpumem_gui.core.replay.autograd import Param, ReplayHooks, Sim
from gpumem_gui.core.replay.buffers import buffers_bytes
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.encoder import EncoderModel
from gpumem_gui.core.replay.engine import backward
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T
from gpumem_gui.core.replay.model import CausalLM
from gpumem_gui.core.replay.optim import (
    create_states,
    outside_allocator,
    paged_total,
    step,
    step_flat,
)
from gpumem_gui.core.replay.seq2seq_bart import seq2seq_lm
from gpumem_gui.core.replay.tricks import optimizer_in_backward
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class PhasePeak:
    """The live-tensor peak of one phase: total bytes, bytes by kind and by tag, and where it happened."""

    total: int
    by_kind: dict[str, int]
    by_tag: dict[str, int]
    where: str


@dataclass(frozen=True)
class StepResult:
    phases: dict[str, PhasePeak]
    after_forward: int
    microbatch_activations: int
    param_bytes: int
    full_param_bytes: int  # this rank's parameters unsharded (what ZeRO-3/FSDP gather, what offload moves)
    trainable_bytes: int
    trainable_params: int
    grad_bytes: int
    state_bytes: int
    buffer_bytes: int
    input_bytes: int
    # whole-parameter state partition: (rank replayed, its trainable elements, all trainable elements)
    state_owner: tuple[int, int, int] | None = None
    # optimizer states outside the torch allocator (bitsandbytes paged: CUDA unified memory), not in any peak
    outside_allocator_bytes: int = 0
    host_bytes: int = 0  # CPU RAM of offloaded activations at their most (replay/tricks.py Offloader)
    # every allocation, free and phase start in order (simulate_step(record=True)), for the allocator model
    events: tuple[Event, ...] | None = None
    allocator: AllocatorReport | None = None  # what the caching allocator model made of them


@dataclass(frozen=True)
class StepOptions:
    """The optimizer side of a step: states sharded over ``state_shard`` ranks (ZeRO-1+), kept off the GPU
    (offload), fp32 master weights of a 16-bit model, the fused step of Megatron's optimizer."""

    grad_accum: int = 1
    first_step: bool = False
    state_shard: int = 1
    offload_states: bool = False
    fused_step: bool = False
    master_bytes_per_param: int = 0
    # bytes per trainable parameter of a flat gradient copy the step makes (DeepSpeed's fp32 partition)
    flat_grad_bytes: int = 0
    # states also for trainable parameters no step gives a gradient (flat buffers: DeepSpeed, FSDP, Megatron)
    states_for_unused: bool = False
    # (rank, the trainable parameters whose states it keeps, whole): torch ZeroRedundancyOptimizer; None: all
    owned: Callable[[list[Param]], tuple[int, list[Param]]] | None = None
    # DeepSpeed ZeRO: the element counts of the flat partitions the optimizer steps one after another, each
    # with its own flat gradient (training/frameworks/deepspeed.py FlatPartitions); None: the parameters
    flat_partitions: Callable[[list[Param]], list[int]] | None = None
    # torchtune optimizer_in_bwd: each parameter stepped and its gradient freed as soon as it is accumulated
    optimizer_in_backward: bool = False


# the modules outside the decoder layers a decoder runs as its own (torchtune TransformerDecoder
# tok_embeddings, output), announced by inputs.py embed and logits.py project
OWN_MODULES = frozenset({"embedding", "head"})


class TrainingHooks(ReplayHooks):
    """Hooks of a training framework that can also hold buffers of its own and gather at a micro-batch's
    start (:mod:`gpumem_gui.core.training.sharding`); these defaults add nothing."""

    def module_units(self, sim: Sim, modules: frozenset[str]) -> None:
        """Before the parameters are made: the model runs ``modules`` (of :data:`OWN_MODULES`) as modules of
        their own, each call announced by ``module_forward`` (FSDP2 may make each a unit: torchtune's
        custom_sharded_layers)."""

    def begin_microbatch(self, sim: Sim) -> None:
        """A micro-batch's forward starts."""

    def grad_buffers(self, sim: Sim, trainable_params: int) -> Storage | None:
        """Gradient buffers the framework allocates up front (Megatron's fp32 main_grad), if any."""
        return None

    def end_forward(self, sim: Sim) -> None:
        """A micro-batch's forward (and loss) returned (FSDP2: the root unit's post-forward)."""

    def begin_backward(self, sim: Sim) -> None:
        """``loss.backward()`` starts (FSDP2: the root unit's pre-backward hook)."""


def replayed_microbatches(grad_accum: int) -> int:
    """Micro-batches the step replays: the first, and a second one with every ``.grad`` (or accumulated
    gradient) already live; later ones repeat the second."""
    return min(grad_accum, 2)


def simulate_step(
    spec: ModelSpec,
    cfg: ReplayConfig,
    optimizer: str,
    opts: StepOptions = StepOptions(),
    hooks: TrainingHooks | None = None,
    record: bool = False,
) -> StepResult:
    """Replay one optimizer step of ``spec`` under ``cfg`` and ``optimizer``; ``record``: keep every
    allocation and free in the result's ``events`` (:mod:`gpumem_gui.core.allocator.events`).

    The cyclic garbage collector is paused during the replay: every storage is freed by reference counting
    (the replay's liveness rules), never by the collector, and its passes over the ~10^5 objects the replay
    makes cost about a fifth of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim = Sim(hooks or TrainingHooks())
        if record:
            sim.tr.alloc_log = []
        return run_step(sim, spec, cfg, optimizer, opts)
    finally:
        if was_enabled:
            gc.enable()


def run_step(sim: Sim, spec: ModelSpec, cfg: ReplayConfig, optimizer: str, opts: StepOptions) -> StepResult:
    """The step on ``sim`` (its hooks are the framework's; a tape's runtime records it: :mod:`.step_tape`)."""
    hooks: TrainingHooks = sim.hooks  # type: ignore[assignment]
    tr = sim.tr
    # an encoder with its head (replay/encoder.py), an encoder-decoder (replay/seq2seq.py), a decoder
    kind = {"encoder": EncoderModel, "encoder-decoder": seq2seq_lm}.get(model_kinds(spec).model, CausalLM)
    # a decoder's embedding and head, unless its head reads the embedding's weight (tied; torchtune's
    # TiedLinear is no module) or it is not a decoder (encoder.py, seq2seq.py announce neither)
    own = kind is CausalLM and not (cfg.lm_head and spec.tie_word_embeddings)
    hooks.module_units(sim, OWN_MODULES if own else frozenset())
    model = kind(sim, spec, cfg)
    buffers = sim.storage(buffers_bytes(spec, DT_BYTES.get(cfg.param_dt, 2)), "buffers", "buffer")
    trainable = [p for p in sim.params if p.rg]
    # torch's optimizers keep state only for parameters with a gradient (torch/optim/adam.py, _init_group)
    stepped = trainable if opts.states_for_unused else [p for p in trainable if p.name not in model.unused]
    stepped, owner = _owned(opts, trainable, stepped)
    shapes = model.shape
    flat = opts.flat_partitions(stepped) if opts.flat_partitions is not None else None

    def make_states() -> list[Storage]:
        if opts.offload_states:
            return []
        master = opts.master_bytes_per_param
        return create_states(sim, optimizer, stepped, shapes, opts.state_shard, master, flat)

    states = [] if opts.first_step else make_states()
    state_bytes = sum(st.nbytes for st in states)
    ids = T(sim.storage(cfg.tokens * 8, "input ids", "input"), cfg.tokens, "i64")
    images = (
        vision.step_inputs(sim, spec, cfg) if cfg.images else None
    )  # pixel_values, ... (replay/vision.py)
    main = hooks.grad_buffers(sim, sum(p.numel for p in trainable))
    layer_ids = range(spec.num_layers)
    in_backward = opts.optimizer_in_backward and not opts.offload_states
    if in_backward:
        sim.post_accumulate = optimizer_in_backward(
            optimizer, opts.state_shard, opts.first_step, shapes, opts.master_bytes_per_param, states
        )
    pixels = images.pixel_values if images is not None else None
    after_forward, microbatch_activations = _microbatches(
        sim, model, cfg, ids, layer_ids, opts, hooks, pixels
    )
    tr.start_phase("optimizer")
    tr.where = "optimizer step"
    if opts.first_step and not in_backward:
        states = make_states()
    state_bytes = sum(st.nbytes for st in states)
    if not opts.offload_states and not in_backward:
        _optimizer_step(sim, optimizer, stepped, opts, flat)
    grad_bytes = (
        main.nbytes if main is not None else sum(p.grad.nbytes for p in trainable if p.grad is not None)
    )
    for p in trainable:
        p.grad = None  # zero_grad(set_to_none=True)
    phases = {
        ph: PhasePeak(total=v[0], by_kind=v[1], by_tag=v[2], where=v[3])
        for ph, v in tr.peaks.items()
        if ph in PHASES
    }
    result = StepResult(
        phases=phases,
        after_forward=after_forward,
        microbatch_activations=microbatch_activations,
        param_bytes=sum(p.st.nbytes for p in sim.params),
        full_param_bytes=sum(p.full_bytes for p in sim.params if p.sharded) + cfg.quant_bytes,
        trainable_bytes=sum(p.st.nbytes for p in trainable),
        trainable_params=sum(p.numel for p in trainable),
        grad_bytes=grad_bytes,
        state_bytes=state_bytes,
        buffer_bytes=buffers.nbytes,
        input_bytes=ids.nbytes,
        state_owner=owner,
        outside_allocator_bytes=_outside_allocator(optimizer, stepped, shapes, opts, flat),
        host_bytes=sim.offload.host_peak if sim.offload is not None else 0,
        events=None if tr.alloc_log is None else tuple(tr.alloc_log),
    )
    tr.alloc_log = None  # what the replay frees from here on is no part of the step
    del states, buffers, ids, model, main, images, pixels
    return result


def _owned(
    opts: StepOptions, trainable: list[Param], stepped: list[Param]
) -> tuple[list[Param], tuple | None]:
    """The stepped parameters this rank keeps states for (``opts.owned``: whole parameters per rank) and
    (rank, its trainable elements, all trainable elements)."""
    if opts.owned is None:
        return stepped, None
    rank, mine = opts.owned(trainable)
    kept = {id(p) for p in mine}
    owner = (rank, sum(p.numel for p in mine), sum(p.numel for p in trainable))
    return [p for p in stepped if id(p) in kept], owner


def _optimizer_step(
    sim: Sim, optimizer: str, stepped: list[Param], opts: StepOptions, flat: list[int] | None
) -> None:
    """``optimizer.step()``; DeepSpeed first flattens this rank's gradient partition and casts it to fp32 for
    the master step (``flat_grad_bytes``), one flat partition (``flat``) at a time: ``flatten(grads)`` (a
    ``torch.cat`` of the partition's gradient views, in their 16-bit dtype) then ``.to(float32)``, the 16-bit
    copy freed once cast (``stage_1_and_2.py`` ``step``, ``stage3.py`` ``_prepare_fp32_grad_for_sub_group``;
    an fp32 model's ``.to`` is the copy itself)."""
    master = opts.master_bytes_per_param > 0
    if flat is not None:
        dt = "f32" if master or not stepped else stepped[0].dt
        grad_bytes = DT_BYTES[stepped[0].dt] if stepped else 4
        for numel in flat:
            nb = numel * opts.flat_grad_bytes
            cat = sim.storage(numel * grad_bytes, "fp32 gradient partition", "grad") if nb else None
            flat_grad = sim.storage(nb, "fp32 gradient partition", "grad") if nb and grad_bytes != 4 else cat
            del cat
            step_flat(sim, optimizer, numel, dt, fused=opts.fused_step)
            del flat_grad
        return
    nb = sum(p.numel for p in stepped) * opts.flat_grad_bytes
    flat_grad = sim.storage(-(-nb // opts.state_shard), "fp32 gradient partition", "grad") if nb else None
    step(sim, optimizer, stepped, opts.state_shard, fused=opts.fused_step, master=master)
    del flat_grad


def _outside_allocator(
    optimizer: str,
    stepped: list[Param],
    shapes: dict[str, tuple[int, ...]],
    opts: StepOptions,
    flat: list[int] | None,
) -> int:
    """Bytes of optimizer states outside the torch allocator (bitsandbytes' paged states) on this rank."""
    if not outside_allocator(optimizer) or opts.offload_states:
        return 0
    return paged_total(optimizer, stepped, opts.state_shard, flat)


def _microbatches(
    sim: Sim,
    model: CausalLM,
    cfg: ReplayConfig,
    ids: T,
    layer_ids: range,
    opts: StepOptions,
    hooks: TrainingHooks,
    pixels: T | None = None,
) -> tuple[int, int]:
    """Forward + loss and backward of the micro-batches (the second one, with gradient accumulation, with
    every ``.grad`` already live); returns the live bytes after the last forward and the most activations
    one micro-batch kept."""
    tr = sim.tr
    after_forward = 0
    microbatch_activations = 0
    for _ in range(replayed_microbatches(opts.grad_accum)):
        sim.phase_kind = "act"
        tr.start_phase("forward")
        before, params_before = tr.cur, tr.by_kind["param"]
        hooks.begin_microbatch(sim)
        prev = sim.enter_autocast(cfg.autocast)
        # images: the frozen vision tower, its outputs alive through the language model (replay/vision.py),
        # or a trainable one, run after the prompt's embedding (replay/vision_train.py)
        # (trained, adapted, or hooked by enable_input_require_grads: vision_train.under_autograd)
        tower_grad = vision_train.under_autograd(model)
        held = vision.train_prefix(sim, model.spec, cfg) if cfg.images and not tower_grad else []
        if tower_grad:
            model.embed_images = partial(vision_train.embed_images, pixels=pixels, held=held)
        loss = model.forward_loss(ids, layer_ids)
        model.embed_images = model.after_layer = None
        del held
        if not cfg.lm_head:
            out, loss = loss, sim.new(1, "f32")
            sim.node("copy", (out,), (loss,))  # the gradient of the stage output comes from the next stage
            del out
        sim.exit_autocast(prev)
        hooks.end_forward(sim)
        model.drop_outputs()
        after_forward = tr.cur
        # parameters gathered in this forward and kept (FSDP without reshard) are no micro-batch's own
        kept = after_forward - before - (tr.by_kind["param"] - params_before)
        microbatch_activations = max(microbatch_activations, kept)
        sim.phase_kind = "temp"
        tr.start_phase("backward")
        hooks.begin_backward(sim)
        backward(sim, loss)
        del loss
        hooks.release_units(sim)
    return after_forward, microbatch_activations
