"""A symbolic PyTorch runtime: tensors with sizes and dtypes but no data, freed when PyTorch frees them.

Memory is a question of *liveness*: which tensors exist at each moment of a forward, a backward and an
optimizer step. PyTorch frees a tensor when its last reference goes away: a Python name, an autograd node
that saved it for backward, a gradient buffer of the backward engine, the autocast weight-cast cache. This
module reproduces those owners with the same rules, so the model code written against it
(:mod:`gpumem_gui.core.replay.model`) allocates and frees in the order the real ``transformers`` code does:

* every tensor owns a :class:`Storage`; views share it. A storage is freed when the last Python reference
  to it goes away (CPython reference counting, exactly as ``torch`` storages), which the :class:`Tracker`
  records;
* every differentiable op makes a :class:`Node` holding the storages it saves for backward (the rules of
  ``tools/autograd/derivatives.yaml``: ``mm`` saves ``mat2`` only if ``mat1`` needs a gradient, and ``mat1``
  only if ``mat2`` does; ``mul`` saves each operand for the other's gradient; ``silu``/``pow`` save their
  input; ``rsqrt``/``log_softmax`` their output; flash/efficient SDPA saves q, k, v, out and the
  log-sum-exp). With gradients off (``torch.no_grad()``, inference) no node is made and nothing is saved;
* ``torch.autocast``: matmul-like ops cast their inputs to the lower precision; casts of leaf tensors that
  need a gradient (the weights) are cached until the outermost autocast context exits
  (``aten/src/ATen/autocast_mode.cpp`` ``cached_cast``);
* non-reentrant activation checkpointing (``torch/utils/checkpoint.py``, ``use_reentrant=False``): saved
  tensors of the checkpointed function are replaced by holders, its inputs are kept, and the first unpack in
  backward recomputes the function (stopping early once every holder is refilled).

The backward engine is :mod:`gpumem_gui.core.replay.engine`. What a training framework changes (gradients
reduce-scattered, parameters gathered per unit, main-grad buffers) reaches the runtime through
:class:`ReplayHooks`, never through edits here.

Kinds (what PyTorch's ``MemTracker`` reports): ``param``, ``buffer``, ``grad``, ``optstate``, ``act`` (created
in the forward), ``temp`` (created in the backward or the optimizer step), ``input``. Tags say what a storage
is: the forward's region (``hidden_states``, ``attention``, ``mlp``, ``norm``, ``rope``, ``mask``, ``inputs``,
``kv_cache``, ``logits``) or a training role (``parameters``, ``gradients``, ``weight copies``, ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumem_gui.core.replay.memory import DT_BYTES, FLOATS, Storage, T, Tracker


class Param:
    """A leaf parameter: its storage, whether it trains, its ``.grad`` and its ``AccumulateGrad`` node.

    ``layer`` is the decoder layer it belongs to (None outside the stack): the unit sharding hooks gather;
    ``sharded``: whether data-parallel sharding splits it (LoRA adapters and bitsandbytes' packed base are
    kept whole on every rank)."""

    __slots__ = ("acc", "dt", "full_bytes", "grad", "layer", "name", "numel", "rg", "sharded", "st", "tensor")

    def __init__(
        self,
        sim: Sim,
        name: str,
        numel: int,
        dt: str,
        rg: bool,
        nbytes: int,
        full_bytes: int,
        layer: int | None,
        sharded: bool = True,
    ) -> None:
        self.name = name
        self.sharded = sharded
        self.numel = numel
        self.dt = dt
        self.rg = rg
        self.layer = layer
        self.full_bytes = full_bytes
        self.st = sim.storage(nbytes, "parameters", "param")
        self.grad: Storage | None = None
        self.acc = Node(sim, "acc", (), ((numel, dt),), ()) if rg else None
        if self.acc is not None:
            self.acc.param = self
            self.acc.seq = 1 << 62  # AccumulateGrad runs as soon as it is ready (sequence_nr UINT64_MAX)
        self.tensor = T(self.st, numel, dt, rg, self.acc, 0, self)


class Node:
    """One autograd node: what it saved, where its input gradients go, sizes of its inputs and outputs."""

    __slots__ = (
        "ctx",
        "edges",
        "frame",
        "in_meta",
        "kind",
        "n_saved",
        "out_meta",
        "packed",
        "param",
        "saved",
        "seq",
        "unit",
        "where",
    )

    def __init__(
        self,
        sim: Sim,
        kind: str,
        inputs: tuple[T | None, ...],
        out_meta: tuple[tuple[int, str], ...],
        saved: tuple[Storage, ...],
        ctx: Any = None,
    ) -> None:
        seq = sim.seq + 1
        sim.seq = seq
        self.seq = seq
        self.kind = kind
        if len(inputs) == 1:  # most ops: no lists to build
            x = inputs[0]
            if x is None:
                self.edges: tuple[tuple[Node, int] | None, ...] = (None,)
                self.in_meta: tuple[tuple[int, str], ...] = (_NO_META,)
            else:
                fn = x.fn
                self.edges = (None if fn is None else (fn, x.idx),)
                self.in_meta = ((x.n, x.dt),)
        else:
            edges: list[tuple[Node, int] | None] = []
            in_meta: list[tuple[int, str]] = []
            for x in inputs:
                if x is None:
                    edges.append(None)
                    in_meta.append(_NO_META)
                else:
                    fn = x.fn
                    edges.append(None if fn is None else (fn, x.idx))
                    in_meta.append((x.n, x.dt))
            self.edges = tuple(edges)
            self.in_meta = tuple(in_meta)
        self.out_meta = out_meta
        self.saved: tuple[Storage, ...] | None = saved
        self.n_saved = len(saved)
        self.ctx = ctx
        self.frame: CkptFrame | None = None
        self.param: Param | None = None
        self.packed: Any = None  # saved tensors a saved_tensors_hooks pack moved off the GPU (tricks.py)
        self.where = sim.tr.where
        self.unit = sim.unit


_NO_META = (0, "f32")  # the size of an absent input (None)
# what ``T.fn`` of a tensor made during a checkpoint recomputation points to: it needs a gradient, but the
# recomputed graph is never run
_RECOMPUTED: Node = Node.__new__(Node)


class StopRecompute(Exception):
    """Raised once a checkpoint recomputation has refilled every holder (early stop)."""


@dataclass(eq=False)
class CkptFrame:
    """A non-reentrant checkpoint region: the function and its inputs, kept for the recomputation."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    autocast: str | None
    nodes: list[Node] = field(default_factory=list)
    expected: int = 0
    recomputed: bool = False
    buf: list[Storage] = field(default_factory=list)
    # selective activation checkpointing: the policy sees every op of the region (replay/tricks.py) and
    # keeps the outputs it must save until the recomputation
    policy: Any = None
    keep: list[Storage] = field(default_factory=list)


class ReplayHooks:
    """What a training framework changes in the replay. These defaults are one GPU running plain PyTorch;
    sharded data parallelism (:mod:`gpumem_gui.core.training.sharding`) overrides them."""

    def param_bytes(self, full_bytes: int, layer: int | None) -> int:
        """Bytes one rank stores of a parameter of ``full_bytes`` (sharded: its slice; offloaded: none)."""
        return full_bytes

    def enter_unit(self, sim: Sim, unit: int | None, prefetch: tuple[int, ...] = ()) -> None:
        """The forward or backward reaches parameter unit ``unit`` (a decoder layer; -1: the root unit)."""
        sim.unit = unit

    def release_units(self, sim: Sim) -> None:
        """The backward of a micro-batch is over: gathered units are freed."""
        sim.unit = None

    def module_forward(self, sim: Sim, module: str, entering: bool, alone: bool = False) -> None:
        """``module`` ('embedding', 'head': FSDP2 may make each a unit) starts or ends a forward call
        (``alone``: called after the model's forward returned, by the loss)."""

    def param_made(self, sim: Sim, p: Param) -> None:
        """Parameter ``p`` was just made (FSDP2 files it under its unit and may resize what this rank
        stores of it)."""

    def gradient_ready(self, sim: Sim, p: Param, g: Storage) -> None:
        """``AccumulateGrad``: the first gradient is stolen into ``.grad``, later ones are added in place
        (``torch/csrc/autograd/functions/accumulate_grad.h``)."""
        if p.grad is None:
            sim.tr.retag(g, "grad", "gradients")
            p.grad = g


class Sim:
    """The symbolic runtime: tracker, grad mode, autocast state, checkpoint state, framework hooks."""

    def __init__(self, hooks: ReplayHooks | None = None) -> None:
        self.tr = Tracker()
        self.hooks = hooks or ReplayHooks()
        self.seq = 0
        self.grad_enabled = True
        self.autocast: str | None = None
        self.cast_cache: dict[int, T] = {}
        self.ckpt: CkptFrame | None = None
        self.recomputing: CkptFrame | None = None
        self.params: list[Param] = []
        self.phase_kind = "act"  # kind of storages made now: act in forward, temp in backward/optimizer
        self.region = "hidden_states"  # the forward region new tensors are tagged with
        self.unit: int | None = None  # the parameter unit the model is in (sharding hooks gather by it)
        # torch.autograd.graph.saved_tensors_hooks in force (activation offload, replay/tricks.py), and the
        # post-accumulate-grad hooks of every parameter (optimizer in backward): None when there are none
        self.offload: Any = None
        self.post_accumulate: Callable[[Sim, Param], None] | None = None

    # ---- allocation ------------------------------------------------------------------------------------
    def storage(self, nbytes: int, tag: str, kind: str | None = None) -> Storage:
        return Storage(self.tr, int(nbytes), kind or self.phase_kind, tag)

    def new(self, n: int, dt: str, tag: str | None = None) -> T:
        return T(Storage(self.tr, round(n * DT_BYTES[dt]), self.phase_kind, tag or self.region), n, dt)

    def param(
        self,
        name: str,
        numel: int,
        dt: str,
        rg: bool,
        full_bytes: int,
        layer: int | None,
        sharded: bool = True,
    ) -> Param:
        """A parameter of ``full_bytes`` unsharded; this rank stores what the hooks say (``sharded=False``:
        the whole of it, on every rank)."""
        nbytes = self.hooks.param_bytes(full_bytes, layer) if sharded else full_bytes
        p = Param(self, name, numel, dt, rg, nbytes, full_bytes, layer, sharded)
        self.params.append(p)
        self.hooks.param_made(self, p)
        return p

    # ---- graph -----------------------------------------------------------------------------------------
    def node(
        self,
        kind: str,
        inputs: tuple[T | None, ...],
        outputs: tuple[T, ...],
        saved: tuple[T | Storage | None, ...] = (),
        ctx: Any = None,
    ) -> None:
        """Record ``kind`` over ``inputs`` if any needs a gradient; the outputs then need one too."""
        if not self.grad_enabled:
            return
        for x in inputs:
            if x is not None and x.fn is not None:
                break
        else:
            return
        if saved:
            lst: list[Storage] = []
            for sv in saved:
                if sv is None:
                    continue
                st = sv.st if isinstance(sv, T) else sv
                if st is not None:
                    lst.append(st)
            sts: tuple[Storage, ...] = tuple(lst)
            del lst
        else:
            sts = ()
        frame = self.recomputing
        if frame is not None:
            # recomputation inside backward: what this node saves refills the original nodes' holders. The
            # node itself is never run (the graph of the recomputation is thrown away, it saves nothing and
            # dies with its outputs), so its outputs only need to be marked as requiring a gradient; the
            # sequence number still advances as if it had been made.
            self.seq += 1
            buf = frame.buf
            for st in sts:
                if len(buf) < frame.expected:
                    buf.append(st)
            if len(buf) >= frame.expected:
                raise StopRecompute
            for i, o in enumerate(outputs):
                o.fn = _RECOMPUTED
                o.idx = i
            return
        if len(outputs) == 1:
            o = outputs[0]
            meta: tuple[tuple[int, str], ...] = ((o.n, o.dt),)
        else:
            meta = tuple([(o.n, o.dt) for o in outputs])
        off = self.offload
        packed = None
        if off is not None and off.active and sts and self.ckpt is None:
            sts, packed = off.pack(sts, kind)
        nd = Node(self, kind, inputs, meta, sts, ctx)
        nd.packed = packed
        ck = self.ckpt
        if ck is not None and ck.policy is not None:
            ck.policy(self, kind, inputs, outputs, ck)
        if ck is not None and sts:
            nd.saved = None  # the pack hook stores a holder, not the tensor
            nd.frame = ck
            ck.nodes.append(nd)
            ck.expected += len(sts)
        for i, o in enumerate(outputs):
            o.fn = nd
            o.idx = i

    # ---- autocast -----------------------------------------------------------------------------------------
    def cast(self, x: T, dt: str, tag: str | None = None) -> T:
        """``x.to(dt)``: the same tensor when the dtype already matches, else a copy (ToCopyBackward)."""
        if x.dt == dt:
            return x
        out = self.new(x.n, dt, tag)
        self.node("to", (x,), (out,))
        return out

    def ac_cast(self, x: T | None) -> T | None:
        """What autocast does to one input of a lower-precision op: floats go to the autocast dtype; casts of
        leaves that need a gradient are cached for the rest of the autocast region."""
        dt = self.autocast
        if x is None or dt is None or x.dt not in FLOATS or x.dt == dt:
            return x
        if x.param is not None and x.fn is not None:
            hit = self.cast_cache.get(id(x.param))
            if hit is not None:
                return hit
            c = self.cast(x, dt, "weight copies")
            self.cast_cache[id(x.param)] = c
            return c
        return self.cast(x, dt)

    def enter_autocast(self, dt: str | None) -> str | None:
        prev = self.autocast
        self.autocast = dt
        return prev

    def exit_autocast(self, prev: str | None) -> None:
        self.autocast = prev
        if prev is None:
            self.cast_cache.clear()

    # ---- checkpoint --------------------------------------------------------------------------------------
    def checkpoint(self, fn: Callable[..., Any], *args: Any, policy: Any = None) -> Any:
        """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``; ``policy``: a selective
        checkpointing policy (``context_fn=create_selective_checkpoint_contexts(policy)``)."""
        if not self.grad_enabled or self.ckpt is not None:
            return fn(*args)
        frame = CkptFrame(fn, args, self.autocast, policy=policy)
        self.ckpt = frame
        try:
            out = fn(*args)
        finally:
            self.ckpt = None
        if not frame.nodes:
            frame.args = ()
        elif self.offload is not None and self.offload.active:
            # _NoopSaveInputs saves the positional inputs through the saved-tensor hooks in force
            frame.args = self.offload.pack_args(frame.args)
        return out

    def recompute(self, frame: CkptFrame) -> None:
        """The first unpack of a holder in backward: run the checkpointed function again (tensors it makes
        are backward temporaries) until every holder of the frame is refilled."""
        self.recomputing = frame
        frame.buf = []
        frame.keep = []  # the recomputation hands the saved outputs back (the replay makes them again)
        prev_kind, self.phase_kind = self.phase_kind, "temp"
        prev_ac = self.enter_autocast(frame.autocast)
        saved_cache = self.cast_cache
        self.cast_cache = {}
        args = frame.args if self.offload is None else self.offload.unpack_args(self, frame.args)
        try:
            with contextlib.suppress(StopRecompute):
                frame.fn(*args)
        finally:
            self.recomputing = None
            self.cast_cache = saved_cache
            self.autocast = prev_ac
            self.phase_kind = prev_kind
        del args
        buf = frame.buf
        k = 0
        for nd in frame.nodes:
            nd.saved = tuple(buf[k : k + nd.n_saved])
            k += nd.n_saved
        frame.buf = []
        frame.recomputed = True
