"""Drive one training step on the symbolic runtime: forward + loss, backward, optimizer step.

``simulate_step`` builds the model's parameters (:mod:`train_model`), the optimizer states
(:mod:`train_optim`, steady state: they exist before the step; first step: created inside it), runs the
micro-batches (the second one, when there is gradient accumulation, with every ``.grad`` already live), then
the optimizer step, and returns each phase's peak with what was live at it.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass

from gpumem_gui.core.replay.autograd import Sim, T
from gpumem_gui.core.replay.causal_lm import CausalLM, StepConfig
from gpumem_gui.core.replay.optim import create_states, step
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


def simulate_step(
    spec: ModelSpec,
    cfg: StepConfig,
    optimizer: str,
    *,
    grad_accum: int = 1,
    first_step: bool = False,
    layers: Sequence[int] | None = None,
    grad_shard: int = 1,
    state_shard: int = 1,
    offload_states: bool = False,
    main_grad: bool = False,
    master_bytes_per_param: int = 0,
) -> StepResult:
    """Replay one optimizer step of ``spec`` under ``cfg`` and ``optimizer``.

    The cyclic garbage collector is paused during the replay: every storage is freed by reference counting
    (the replay's liveness rules), never by the collector, and its passes over the ~10^5 objects the replay
    makes cost about a fifth of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate_step(
            spec,
            cfg,
            optimizer,
            grad_accum=grad_accum,
            first_step=first_step,
            layers=layers,
            grad_shard=grad_shard,
            state_shard=state_shard,
            offload_states=offload_states,
            main_grad=main_grad,
            master_bytes_per_param=master_bytes_per_param,
        )
    finally:
        if was_enabled:
            gc.enable()


def _simulate_step(
    spec: ModelSpec,
    cfg: StepConfig,
    optimizer: str,
    *,
    grad_accum: int,
    first_step: bool,
    layers: Sequence[int] | None,
    grad_shard: int,
    state_shard: int,
    offload_states: bool,
    main_grad: bool,
    master_bytes_per_param: int,
) -> StepResult:
    sim = Sim()
    tr = sim.tr
    model = CausalLM(sim, spec, cfg)
    buffers = sim.storage(model.buffers_bytes(), "buffers", "buffer")
    trainable = [p for p in sim.params if p.rg]

    shapes = model.shape

    def make_states() -> list:
        if offload_states:
            return []
        return create_states(sim, optimizer, trainable, shapes, state_shard, master_bytes_per_param)

    states = [] if first_step else make_states()
    state_bytes = sum(st.nbytes for st in states)
    ids = T(sim.storage(cfg.batch * cfg.seq * 8, "input ids", "input"), cfg.batch * cfg.seq, "i64")
    if main_grad:
        sim.main_grad = True
        main = sim.storage(4 * sum(p.numel for p in trainable) // max(1, grad_shard), "gradients", "grad")
    else:
        main = None
    sim.grad_shard = grad_shard
    sim.grads_offloaded = offload_states
    layer_ids = range(spec.num_layers) if layers is None else layers
    after_forward = 0
    microbatch_activations = 0
    for _ in range(min(grad_accum, 2)):
        sim.phase_kind = "act"
        tr.start_phase("forward")
        before = tr.cur
        if cfg.gather == "all":
            sim.gather(None, tuple(sorted(sim.unit_bytes)))
        elif cfg.gather == "unit":
            sim.gather(-1)
        prev = sim.enter_autocast(cfg.autocast)
        loss = model.forward_loss(ids, layer_ids)
        if not cfg.lm_head:
            out, loss = loss, sim.new(1, "f32")
            sim.node("copy", (out,), (loss,))  # the gradient of the stage output comes from the next stage
            del out
        sim.exit_autocast(prev)
        model.drop_outputs()
        after_forward = tr.cur
        microbatch_activations = max(microbatch_activations, after_forward - before)
        sim.phase_kind = "temp"
        tr.start_phase("backward")
        sim.backward(loss)
        del loss
        sim.release_gathered()
    tr.start_phase("optimizer")
    tr.where = "optimizer step"
    if first_step:
        states = make_states()
        state_bytes = sum(st.nbytes for st in states)
    if not offload_states:
        step(sim, optimizer, trainable, state_shard, fused=main_grad)
    grad_bytes = sum(p.grad.nbytes for p in trainable if p.grad is not None)
    if main is not None:
        grad_bytes = main.nbytes
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
        full_param_bytes=sum(model.unit_full.values()) + cfg.quant_bytes,
        trainable_bytes=sum(p.st.nbytes for p in trainable),
        trainable_params=sum(p.numel for p in trainable),
        grad_bytes=grad_bytes,
        state_bytes=state_bytes,
        buffer_bytes=buffers.nbytes,
        input_bytes=ids.nbytes,
    )
    del states, buffers, ids, model, main
    return result
