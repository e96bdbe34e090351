"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as hooks on the replay: what one rank allocates, by unit.

A *unit* is one ``fully_shard`` call: each decoder layer, the embedding and the head where sharded apart
(torchtune ``custom_sharded_layers``), the root (``fully_shard(model)``: the rest). Sources: torch 2.13's
``torch/distributed/fsdp/_fully_shard`` (``_fsdp_param_group.py`` = PG, ``_fsdp_collectives.py`` = COLL,
``_fsdp_param.py`` = PARAM, ``_fsdp_state.py`` = STATE):

* stored: every parameter is a padded 1/world shard of its own (PARAM ``_init_sharded_param``:
  ``ceil(dim0 / world)`` rows), in the parameter's own dtype (fp32 under ``MixedPrecisionPolicy``), none on
  the GPU under ``CPUOffloadPolicy``;
* forward, per unit (PG ``pre_forward`` -> ``unshard`` -> COLL ``foreach_all_gather``: one flat
  all-gather output of world x the unit's shards in ``param_dtype``; with a ``param_dtype`` cast or CPU
  offload the shards are first copied into a flat input, COLL ``_get_param_all_gather_inputs``), then PG
  ``wait_for_unshard`` -> COLL ``foreach_all_gather_copy_out`` into the unsharded parameters (PARAM
  ``alloc_all_gather_outputs``). In forward the flat output is kept until the *next* unit's copy-out
  (``comm_ctx.all_gather_state``, overlap of copy-out and the next all-gather) and the last one until the
  root's post-forward (STATE ``_post_forward``). PG ``post_forward`` -> ``reshard``:
  ``reshard_after_forward=True`` frees the unsharded parameters, ``False`` keeps them, an int N keeps a
  1/N clone (PARAM ``to_sharded_post_forward``);
* backward (PG ``pre_backward``: the root's at the loss, a layer's at its output's gradient): unshard again
  if resharded (the flat output is freed right after the copy-out in backward), then prefetch the unit before
  it in forward order (PG ``_backward_prefetch``: its flat all-gather output waits, allocated, until that
  unit's own pre-backward). Gradients of the unsharded parameters (``param_dtype``) accumulate as autograd
  makes them; PG ``post_backward`` (after the unit's backward; the root's in the final callback, STATE
  ``_root_post_backward_final_callback``) reshards, frees the previous unit's reduce-scatter input
  (``reduce_scatter_states``, one kept by default), copies the gradients into a new flat reduce-scatter input
  (``reduce_dtype``, COLL ``foreach_reduce``), frees them, and makes the reduce-scatter output: one flat
  1/world buffer the unit's sharded ``.grad`` are views of (moved to the CPU under offload).

Tracker categories (``torch/distributed/_tools/fsdp2_mem_tracker.py``): the flat all-gather output is "All
Gather", the unsharded parameters "Unsharded Param" (both parameters); gradients are "Temp" until their
unit's post-backward starts ("Unsharded Grad" then), the reduce-scatter input and output "Temp" until the
collective runs and post-backward returns ("Reduce Scatter", "Sharded Grad"); the 1/N clone of
``reshard_after_forward=N`` is made in forward and stays an "Activation".

Streams (what the allocator model sees, :data:`AG_COPY_IN_STREAM`, :data:`RS_STREAM`): the flat all-gather
input and output are made on the all-gather copy-in stream, the reduce-scatter output on the reduce-scatter
stream, everything else on the default stream.

Pipelining (``torch/distributed/pipelining/stage.py``, ``pipeline``: the micro-batches replayed): every
micro-batch's backward runs with ``set_requires_gradient_sync(False)`` and
``set_reshard_after_backward(False)`` (``backward_maybe_with_nosync``), so PG ``post_backward`` neither
reshards nor reduces: the unsharded parameters stay, and the gradients accumulate unsharded, upcast to the
reduce dtype on the first micro-batch (PARAM ``to_accumulated_grad_if_needed``:
``unsharded_grad.to(reduce_dtype)``, the ``param_dtype`` gradient freed) and added in on the later ones
(``accumulate_unsharded_grad_if_needed``; without an upcast the ``.grad`` itself accumulates in place).
After the last micro-batch ``perform_reduce_grad`` runs every unit's ``post_backward`` with gradient sync:
reduce-scatter from the accumulated gradients, then reshard.

Gradient accumulation without sync (``set_requires_gradient_sync(False)`` on every micro-batch but the last,
as accelerate's ``no_sync`` does for FSDP2; ``unsynced``: the micro-batches replayed so): PG
``post_backward`` with ``reduce_grads`` off reshards (``reshard_after_backward`` stays True) and then keeps
the gradients unsharded as above, upcast to the reduce dtype after the reshard; the last micro-batch's
``post_backward`` adds its gradients into the accumulated ones (``accumulate_unsharded_grad_if_needed``) and
reduce-scatters them unit by unit during its backward.

Approximations: a shard is ``ceil(numel / world)`` elements (exact when ``dim0`` divides by world, as for
the models here); the reduce dtype never differs from the stored dtype in the precisions offered (no
upcast copy of the reduce output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpumem_gui.core.allocator.events import DEFAULT_STREAM
from gpumem_gui.core.replay.autograd import Param, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage
from gpumem_gui.core.replay.step import TrainingHooks

ROOT = -1
# the units of the modules a decoder may shard apart (replay/step.py OWN_MODULES), and the parameters of each
OWN_UNITS = {"embedding": -2, "head": -3}
_OWN_PREFIX = {"embed_tokens.": "embedding", "lm_head.": "head"}
# The side streams FSDP2 allocates on (PG ``FSDPCommContext.lazy_init``), as the allocator model tells streams
# apart: COLL ``foreach_all_gather`` makes the flat all-gather input and output under
# ``device_handle.stream(all_gather_copy_in_stream)`` (PG ``get_all_gather_streams``: the copy-in stream in
# FORWARD and PRE_BACKWARD without ``unshard_async_op``, the only unshards replayed); COLL ``foreach_reduce``
# makes the reduce-scatter output under ``device_handle.stream(reduce_scatter_stream)``, while the
# reduce-scatter input is made before it, on the current (default) stream. Neither is freed with
# ``record_stream`` (PG ``AllGatherState`` holds the all-gather output until the next unit's copy-out; the
# sharded gradients, views of the reduce-scatter output, hold it until zero_grad: COLL ``foreach_reduce``'s
# closing comment), so a freed buffer is cached for its own stream's next allocations only.
AG_COPY_IN_STREAM, RS_STREAM = 1, 2
# the aggregate parameter the replay makes for a QLoRA model's 4-bit linears (model.py _build_params)
BNB_AGGREGATE = "bnb 4-bit linears"


@dataclass
class _Unit:
    """One ``fully_shard`` unit: its trainable parameters and byte sizes."""

    full: int = 0  # unsharded bytes in the compute dtype (= the flat all-gather output)
    shard_compute: int = 0  # one rank's shards in the compute dtype (the flat all-gather input)
    rs: int = 0  # flat reduce-scatter input: the padded unsharded gradients in the reduce dtype
    trainable: list[Param] = field(default_factory=list)


@dataclass(frozen=True)
class Fsdp2Policy:
    """``world``: ranks a unit is sharded over (the HSDP shard group); ``reshard``: ``reshard_after_forward``
    as an int (0: False, ``world``: True, else the post-forward shard group); ``store_scale``: stored bytes
    per compute byte (2: fp32 shards under ``MixedPrecisionPolicy(param_dtype=bf16)``); ``reduce_bytes``:
    bytes of the reduce dtype (0: the gradient's own); ``offload``: ``CPUOffloadPolicy``; ``qlora``: the
    4-bit base is sharded with ``bnb_4bit_quant_storage=bf16``."""

    world: int
    reshard: int
    store_scale: int = 1
    reduce_bytes: int = 0
    offload: bool = False
    qlora: bool = False
    nf4_sharded: bool = False  # QLoRA with torchao's NF4Tensor: its scalers are sharded with its data
    pipeline: int = 0  # pipelining: how many micro-batches the replay runs (0: no pipeline)
    unsynced: int = 0  # micro-batches replayed under set_requires_gradient_sync(False) (no pipeline)
    root_reshard: bool = True  # False: the root unit keeps its unsharded parameters after forward
    own_modules: frozenset[str] = frozenset()  # units of their own (module_forward): embedding, head


class Fsdp2Hooks(TrainingHooks):
    """One rank of an FSDP2 step (see the module docstring)."""

    def __init__(self, policy: Fsdp2Policy) -> None:
        self.pol = policy
        self.units: dict[int, _Unit] = {}
        self.unit_of: dict[int, int] = {}  # id(param) -> unit
        self.packed = 0  # QLoRA: bytes of the packed 4-bit weights (sharded like any parameter)
        self.unsharded: dict[int, Storage] = {}
        self.pending: dict[int, Storage] = {}  # all-gathered, not yet copied out (prefetch)
        self.post_shard: dict[int, Storage] = {}  # reshard_after_forward=N clones
        self.ugrads: dict[int, dict[int, Storage]] = {}  # unit -> id(param) -> unsharded gradient
        self.ag_state: Storage | None = None  # the forward's last flat all-gather output
        self.rs_in: Storage | None = None  # the last reduce-scatter input (reduce_scatter_states)
        self.order: list[int] = []  # post-forward order (comm_ctx.post_forward_order)
        self.in_backward = False
        self.pre_bw: set[int] = set()
        self.done: set[int] = set()
        self.layer: int | None = None
        self._zero: Storage | None = None
        self._outer: int | None = None  # the unit a module of its own was called from (forward)
        self.own: frozenset[str] = frozenset()  # the modules sharded apart (module_units)
        self.acc: dict[int, list[Storage]] = {}  # pipelining: unit -> its accumulated unsharded gradients
        self.microbatch = 0

    # ---- parameters --------------------------------------------------------------------------------
    def param_bytes(self, full_bytes: int, layer: int | None) -> int:
        return 0  # param_made sizes the shard once the parameter is known

    def _shard_elems(self, numel: int) -> int:
        return -(-numel // self.pol.world)

    def param_made(self, sim: Sim, p: Param) -> None:
        pol = self.pol
        if p.name == BNB_AGGREGATE:
            # the packed weights are sharded with their layers; bitsandbytes' quantization state (absmax,
            # code) is no parameter and stays whole on every rank; torchao's NF4Tensor shards it too
            # (torchao/dtypes/nf4tensor.py fsdp_pre_all_gather: quantized_scalers, quantization_factor,
            # quantized_data)
            state = max(0, p.full_bytes - self.packed)
            p.st.grow((self._shard_elems(state) if pol.nf4_sharded else state) - p.st.nbytes)
            return
        u = p.layer if p.layer is not None else self._own_unit(p.name)
        unit = self.units.setdefault(u, _Unit())
        self.unit_of[id(p)] = u
        if pol.qlora and p.full_bytes == 0 and p.numel:
            # a 4-bit linear: numel / 2 bytes packed into a bf16 tensor (bnb_4bit_quant_storage=bf16)
            packed = p.numel // 2
            self.packed += packed
            elems = self._shard_elems(-(-packed // 2))
            unit.full += 2 * elems * pol.world
            unit.shard_compute += 2 * elems
            p.st.grow((0 if pol.offload else 2 * elems) - p.st.nbytes)
            return
        b = DT_BYTES[p.dt]
        elems = self._shard_elems(p.numel)
        unit.full += round(b * elems * pol.world)
        unit.shard_compute += round(b * elems)
        if p.rg:
            unit.trainable.append(p)
            unit.rs += round((pol.reduce_bytes or b) * elems * pol.world)
        p.st.grow((0 if pol.offload else round(b * pol.store_scale * elems)) - p.st.nbytes)
        if pol.store_scale != 1:
            p.dt = "f32"  # the optimizer steps the fp32 shards

    def _own_unit(self, name: str) -> int:
        """The unit of a parameter outside the layers: its module's own one, else the root."""
        module = next((m for pre, m in _OWN_PREFIX.items() if name.startswith(pre)), "")
        return OWN_UNITS[module] if module in self.own else ROOT

    def module_units(self, sim: Sim, modules: frozenset[str]) -> None:
        """The modules the model runs apart (not a head tied to the embedding: torchtune's TiedLinear is no
        module and reads the embedding's weight; not an encoder's): the others stay in the root unit."""
        self.own = modules & self.pol.own_modules

    # ---- all-gather ------------------------------------------------------------------------------------
    def _unshard(self, sim: Sim, u: int) -> None:
        """PG ``unshard`` -> COLL ``foreach_all_gather``: the flat output (and a flat input when cast)."""
        unit = self.units.get(u)
        if unit is None or u in self.unsharded or u in self.pending:
            return
        pol = self.pol
        copy_in = None
        # one rank: no foreach_all_gather, the cast is made on the default stream (PG wait_for_unshard)
        sim.tr.on_stream(AG_COPY_IN_STREAM if pol.world > 1 else DEFAULT_STREAM)
        if u in self.post_shard:
            if pol.store_scale != 1:
                copy_in = sim.storage(self.post_shard[u].nbytes, "all-gather buffers")
        elif pol.store_scale != 1 or pol.offload:
            copy_in = sim.storage(unit.shard_compute, "all-gather buffers")
        self.pending[u] = sim.storage(unit.full if pol.world > 1 else 0, "all-gather buffers", "param")
        del copy_in
        sim.tr.on_stream(DEFAULT_STREAM)

    def _wait(self, sim: Sim, u: int, forward: bool) -> None:
        """PG ``wait_for_unshard``: copy-out into the unsharded parameters; in forward the flat output is
        kept until the next unit's copy-out, in backward freed at once."""
        ag = self.pending.pop(u, None)
        if ag is None:
            return
        # in forward the previous unit's flat output is dropped from comm_ctx but still held by the local
        # ``prev_all_gather_state`` until wait_for_unshard returns, so it lives through this copy-out
        prev, self.ag_state = (self.ag_state, None) if forward else (None, self.ag_state)
        self.unsharded[u] = sim.storage(self.units[u].full, "gathered parameters", "param")
        self.post_shard.pop(u, None)  # PARAM to_unsharded frees the post-forward shard
        if forward and self.pol.world > 1:
            self.ag_state = ag
        del ag, prev

    # ---- forward ---------------------------------------------------------------------------------------
    def begin_microbatch(self, sim: Sim) -> None:
        self.microbatch += 1
        self.order, self.in_backward, self.layer = [], False, None
        self.pre_bw, self.done = set(), set()
        sim.unit = ROOT
        self._unshard(sim, ROOT)
        self._wait(sim, ROOT, forward=True)

    def _post_forward(self, sim: Sim, u: int) -> None:
        """PG ``post_forward`` -> ``reshard`` (``reshard_after_forward``), then ``_record_post_forward``."""
        self.order.append(u)
        r = self.pol.reshard if u != ROOT or self.pol.root_reshard else 0
        if r == 0 or u not in self.unsharded:
            return
        if r < self.pol.world:
            self.post_shard[u] = sim.storage(self.units[u].full // r, "resharded parameters", "act")
        del self.unsharded[u]

    def enter_unit(self, sim: Sim, unit: int | None, prefetch: tuple[int, ...] = ()) -> None:
        if self.in_backward:
            self._enter_backward(sim, unit)
            return
        if self.layer is not None:
            self._post_forward(sim, self.layer)
            self.layer = None
        if unit is not None and unit != ROOT:
            self.layer = unit
            self._unshard(sim, unit)
            self._wait(sim, unit, forward=True)
        sim.unit = unit

    def module_forward(self, sim: Sim, module: str, entering: bool, alone: bool = False) -> None:
        """A unit of its own (torchtune ``custom_sharded_layers``): gathered by its pre-forward hook (PG
        ``pre_forward`` -> ``unshard``, ``wait_for_unshard``), resharded by its post-forward hook as the
        layers are, at each call (the head's per output chunk); in backward the engine enters it (nodes)."""
        u = OWN_UNITS[module]
        if u not in self.units or self.in_backward:
            return
        if entering:
            self._outer = sim.unit
            self._unshard(sim, u)
            self._wait(sim, u, forward=True)
            sim.unit = u
        else:
            self._post_forward(sim, u)
            sim.unit = self._outer
            if alone:  # a call outside the root's forward is its own iteration root (STATE _root_pre_forward
                self.ag_state = None  # claims iter_forward_root) and frees its flat output (_post_forward)

    def end_forward(self, sim: Sim) -> None:
        """STATE ``_post_forward`` of the root: its reshard, and the last flat all-gather output freed."""
        self._post_forward(sim, ROOT)
        self.ag_state = None

    # ---- backward --------------------------------------------------------------------------------------
    def begin_backward(self, sim: Sim) -> None:
        self.in_backward = True
        self._pre_backward(sim, ROOT)

    def _pre_backward(self, sim: Sim, u: int) -> None:
        """PG ``pre_backward``: unshard (a no-op when prefetched or never resharded), then prefetch the unit
        before it in the post-forward order."""
        if u in self.pre_bw:
            return
        self.pre_bw.add(u)
        self._unshard(sim, u)
        self._wait(sim, u, forward=False)
        # the unit run before this one's last call (the head, called per output chunk: before its calls)
        before = self.order[: len(self.order) - self.order[::-1].index(u)] if u in self.order else []
        while before and before[-1] == u:
            before.pop()
        if before:
            self._unshard(sim, before[-1])

    def _enter_backward(self, sim: Sim, unit: int | None) -> None:
        prev = sim.unit
        if unit is not None and unit not in self.done:
            if prev is not None and prev != ROOT and prev not in self.done:
                self._post_backward(sim, prev)
            self._pre_backward(sim, unit)
        sim.unit = unit

    def gradient_ready(self, sim: Sim, p: Param, g: Storage) -> None:
        grads = self.ugrads.setdefault(self.unit_of.get(id(p), ROOT), {})
        if id(p) in grads:
            return  # .grad += g in place (a tied weight's second gradient)
        if self.unit_of.get(id(p), ROOT) in self.acc and not self.pol.reduce_bytes:
            return  # pipelining without an upcast: added in place into the accumulated .grad
        sim.tr.retag(g, g.kind, "unsharded gradients")
        grads[id(p)] = g

    def _accumulate(self, sim: Sim, u: int) -> None:
        """PG ``post_backward`` without gradient sync (and, pipelining, without reshard): the unit's gradients
        kept unsharded, upcast to the reduce dtype into a new buffer on the first micro-batch, added in
        later."""
        self.done.add(u)
        grads = self.ugrads.pop(u, {})
        if not self.pol.pipeline:  # reshard_after_backward: the unsharded parameters freed before the upcast
            self.unsharded.pop(u, None)
            self.post_shard.pop(u, None)
        unit = self.units.get(u)
        if not grads or unit is None or not unit.trainable or u in self.acc:
            return  # later micro-batches: accumulate_unsharded_grad_if_needed adds in place, frees the grad
        if self.pol.reduce_bytes:
            self.acc[u] = [sim.storage(unit.rs, "unsharded gradients", "grad")]
        else:
            self.acc[u] = list(grads.values())
        grads.clear()

    def _reduce_accumulated(self, sim: Sim) -> None:
        """``perform_reduce_grad``: every unit's ``post_backward`` with gradient sync and reshard, reducing
        the accumulated gradients."""
        for u in (ROOT, *sorted(k for k in self.units if k != ROOT)):
            acc = self.acc.pop(u, [])
            self.ugrads[u] = {i: g for i, g in enumerate(acc)}
            del acc
            self._post_backward(sim, u, sync=True)

    def _post_backward(self, sim: Sim, u: int, sync: bool = False) -> None:
        """PG ``post_backward``: reshard, free the previous reduce-scatter input, reduce this unit's
        gradients (COLL ``foreach_reduce``) into its sharded gradients."""
        if (self.pol.pipeline or self.microbatch <= self.pol.unsynced) and not sync:
            self._accumulate(sim, u)
            return
        if u in self.acc:  # the last micro-batch's gradients added into the accumulated ones, then reduced
            self.ugrads[u] = dict(enumerate(self.acc.pop(u)))
        self.done.add(u)
        grads = self.ugrads.pop(u, {})
        self.unsharded.pop(u, None)
        self.post_shard.pop(u, None)
        self.rs_in = None
        unit = self.units.get(u)
        if not grads or unit is None or not unit.trainable:
            return
        # FSDPMemTracker files the unsharded gradients as gradients when post_backward starts, the new
        # buffers as temporaries until the reduce-scatter runs (the input) and post_backward returns (output)
        for g in grads.values():
            sim.tr.retag(g, "grad", "unsharded gradients")
        rs = sim.storage(unit.rs, "reduce-scatter buffers", "temp")
        grads.clear()
        sim.tr.on_stream(RS_STREAM)
        out: Storage | None = sim.storage(unit.rs // self.pol.world, "gradients", "temp")
        sim.tr.on_stream(DEFAULT_STREAM)
        sim.tr.retag(rs, "grad", "reduce-scatter buffers")
        sim.tr.retag(out, "grad", "gradients")
        first = unit.trainable[0]
        if self.pol.offload or first.grad is not None:
            out = None  # copied to the CPU, or added into the existing sharded gradient
        else:
            if self._zero is None:
                self._zero = sim.storage(0, "gradients", "grad")
            for p in unit.trainable:
                p.grad = self._zero
            first.grad = out
        del out
        self.rs_in = rs

    def release_units(self, sim: Sim) -> None:
        """The final callback (STATE ``_root_post_backward_final_callback``): post-backward of every unit
        that has not had one (the root first), then the retained reduce-scatter input is freed."""
        if self.in_backward:
            for u in (ROOT, *sorted(k for k in self.units if k != ROOT)):
                if u not in self.done and (u in self.unsharded or u in self.ugrads or u in self.post_shard):
                    self._post_backward(sim, u)
            if self.pol.pipeline and self.microbatch == self.pol.pipeline:
                self._reduce_accumulated(sim)
            self.rs_in = None
            self.pending.clear()
        self.in_backward = False
        sim.unit = None
