"""A symbolic PyTorch autograd: tensors with sizes and dtypes but no data, for replaying a training step.

Training memory is a question of *liveness*: which tensors exist at each moment of the forward, the backward
and
the optimizer step. PyTorch frees a tensor when its last reference goes away: a Python name, an autograd node
that saved it for backward, a gradient buffer of the backward engine, the autocast weight-cast cache. This
module
reproduces those owners with the same rules, so a model written against it
(:mod:`gpumem_gui.core.replay.causal_lm`)
allocates and frees in the order the real ``transformers`` code does:

* every tensor owns a :class:`Storage`; views share it. A storage is freed when the last Python reference to
  it
  goes away (CPython reference counting, exactly as ``torch`` storages), which the :class:`Tracker` records;
* every differentiable op makes a :class:`Node` holding the storages it saves for backward (the rules of
  ``tools/autograd/derivatives.yaml``: ``mm`` saves ``mat2`` only if ``mat1`` needs a gradient, and ``mat1``
  only if
  ``mat2`` does; ``mul`` saves each operand for the other's gradient; ``silu``/``pow`` save their input;
  ``rsqrt``/``log_softmax`` their output; flash/efficient SDPA saves q, k, v, out and the log-sum-exp);
* :meth:`Sim.backward` runs the engine of ``torch/csrc/autograd/engine.cpp``: ready nodes by descending
  sequence
  number (``AccumulateGrad`` first), gradients of several consumers summed out of place (``InputBuffer``),
  each
  node's incoming gradient freed when it returns and its saved tensors released right after
  (``release_variables``), gradients cast to the input's dtype (``validate_outputs``), leaf gradients stolen
  into ``.grad`` (``AccumulateGrad``) or added in place when ``.grad`` exists (gradient accumulation);
* ``torch.autocast``: matmul-like ops cast their inputs to the lower precision; casts of leaf tensors that
  need a
  gradient (the weights) are cached until the outermost autocast context exits
  (``aten/src/ATen/autocast_mode.cpp``
  ``cached_cast``);
* non-reentrant activation checkpointing (``torch/utils/checkpoint.py``, ``use_reentrant=False``): saved
  tensors of
  the checkpointed function are replaced by holders, its inputs are kept, and the first unpack in backward
  recomputes the function (stopping early once every holder is refilled).

Kinds (what PyTorch's ``MemTracker`` reports): ``param``, ``buffer``, ``grad``, ``optstate``, ``act``
(created in the
forward), ``temp`` (created in the backward or the optimizer step), ``input``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DT_BYTES: dict[str, float] = {
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "i64": 8,
    "i32": 4,
    "u8": 1,
    "bool": 1,
}
FLOATS = ("f32", "bf16", "f16")

KINDS = ("param", "buffer", "grad", "optstate", "act", "temp", "input")
_NO_PEAK = -(1 << 126)  # below any byte count: the first allocation of a phase always sets its peak


def promote(a: str, b: str) -> str:
    """torch's type promotion between two tensors' dtypes (floats only matter here)."""
    if a == b:
        return a
    if a in FLOATS and b not in FLOATS:
        return a
    if b in FLOATS and a not in FLOATS:
        return b
    if "f32" in (a, b):
        return "f32"
    if {a, b} == {"bf16", "f16"}:
        return "f32"
    return a


class Tracker:
    """Live bytes by kind; the peak of each phase with what was live at it and where it happened."""

    def __init__(self) -> None:
        self.cur = 0
        self.by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.by_tag: dict[str, int] = {}
        self.phase = "setup"
        self.where = ""
        self.peaks: dict[str, tuple[int, dict[str, int], dict[str, int], str]] = {}
        self.events = 0
        self.top = _NO_PEAK  # the current phase's peak so far (``peaks[phase][0]``), _NO_PEAK before any
        # allocations and frees are counted by Storage itself (``__init__`` / ``__del__``), the hottest path

    def retag(self, st: Storage, kind: str, tag: str) -> None:
        self.by_kind[st.kind] -= st.nbytes
        self.by_tag[st.tag] -= st.nbytes
        st.kind, st.tag = kind, tag
        self.by_kind[kind] += st.nbytes
        self.by_tag[tag] = self.by_tag.get(tag, 0) + st.nbytes

    def start_phase(self, phase: str) -> None:
        """Enter ``phase``; a phase met again (the next micro-batch) keeps the higher of its peaks."""
        self.phase = phase
        pk = self.peaks.get(phase)
        if pk is None or self.cur > pk[0]:
            self.peaks[phase] = (self.cur, dict(self.by_kind), dict(self.by_tag), self.where)
        self.top = self.peaks[phase][0]


class Storage:
    """The memory of one tensor (shared by its views); freed when the last reference goes away."""

    __slots__ = ("__weakref__", "kind", "nbytes", "tag", "tr")

    def __init__(self, tr: Tracker, nbytes: int, kind: str, tag: str) -> None:
        self.tr = tr
        self.nbytes = nbytes
        self.kind = kind
        self.tag = tag
        # count it in the tracker; a new high of the phase records what is live and where
        cur = tr.cur + nbytes
        tr.cur = cur
        tr.by_kind[kind] += nbytes
        by_tag = tr.by_tag
        by_tag[tag] = by_tag.get(tag, 0) + nbytes
        if cur > tr.top:
            tr.top = cur
            tr.peaks[tr.phase] = (cur, dict(tr.by_kind), dict(by_tag), tr.where)

    def __del__(self) -> None:
        tr = self.tr
        n = self.nbytes
        tr.cur -= n
        tr.by_kind[self.kind] -= n
        tr.by_tag[self.tag] -= n


class Param:
    """A leaf parameter: its storage, whether it trains, its ``.grad`` and its ``AccumulateGrad`` node."""

    __slots__ = ("acc", "dt", "grad", "name", "numel", "rg", "st", "tensor")

    def __init__(self, sim: Sim, name: str, numel: int, dt: str, rg: bool, nbytes: int | None = None) -> None:
        self.name = name
        self.numel = numel
        self.dt = dt
        self.rg = rg
        nb = round(numel * DT_BYTES[dt]) if nbytes is None else nbytes
        self.st = Storage(sim.tr, nb, "param", "parameters")
        self.grad: Storage | None = None
        self.acc = Node(sim, "acc", (), ((numel, dt),), ()) if rg else None
        if self.acc is not None:
            self.acc.param = self
            self.acc.seq = 1 << 62  # AccumulateGrad runs as soon as it is ready (sequence_nr UINT64_MAX)
        self.tensor = T(self.st, numel, dt, rg, self.acc, 0, self)


class T:
    """A tensor: its storage, element count, dtype, whether it needs a gradient and the node that made it."""

    __slots__ = ("dt", "fn", "idx", "n", "param", "st")

    def __init__(
        self,
        st: Storage | None,
        n: int,
        dt: str,
        rg: bool = False,
        fn: Node | None = None,
        idx: int = 0,
        param: Param | None = None,
    ) -> None:
        self.st = st
        self.n = n
        self.dt = dt
        self.fn = fn if rg else None
        self.idx = idx
        self.param = param

    @property
    def rg(self) -> bool:
        return self.fn is not None

    @property
    def nbytes(self) -> int:
        return round(self.n * DT_BYTES[self.dt])


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


class Sim:
    """The symbolic runtime: tracker, grad mode, autocast state, checkpoint state, backward engine."""

    def __init__(self) -> None:
        self.tr = Tracker()
        self.seq = 0
        self.grad_enabled = True
        self.autocast: str | None = None
        self.cast_cache: dict[int, T] = {}
        self.ckpt: CkptFrame | None = None
        self.recomputing: CkptFrame | None = None
        self.params: list[Param] = []
        self.phase_kind = "act"  # kind of storages made now: act in forward, temp in backward/optimizer
        # data-parallel sharding (ZeRO / FSDP): gradients kept as 1/grad_shard after their reduce-scatter;
        # megatron-style fp32 main_grad buffers instead of .grad; gathered parameter units (ZeRO-3 / FSDP)
        self.grad_shard = 1
        self.main_grad = False
        self.grads_offloaded = False
        self.unit: int | None = None
        self.unit_bytes: dict[int, int] = {}
        self.gather_cap = 0
        self.gathered: dict[int, Storage] = {}

    # ---- allocation ------------------------------------------------------------------------------------
    def storage(self, nbytes: int, tag: str, kind: str | None = None) -> Storage:
        return Storage(self.tr, int(nbytes), kind or self.phase_kind, tag)

    def new(self, n: int, dt: str, tag: str = "activations") -> T:
        return T(Storage(self.tr, round(n * DT_BYTES[dt]), self.phase_kind, tag), n, dt)

    def param(self, name: str, numel: int, dt: str, rg: bool, nbytes: int | None = None) -> Param:
        p = Param(self, name, numel, dt, rg, nbytes)
        self.params.append(p)
        return p

    # ---- graph -----------------------------------------------------------------------------------------
    def needs_grad(self, *xs: T | None) -> bool:
        return self.grad_enabled and any(x is not None and x.fn is not None for x in xs)

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
        nd = Node(self, kind, inputs, meta, sts, ctx)
        ck = self.ckpt
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
        out = self.new(x.n, dt, tag or (x.st.tag if x.st is not None else "activations"))
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
    def checkpoint(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``."""
        if not self.grad_enabled or self.ckpt is not None:
            return fn(*args)
        frame = CkptFrame(fn, args, self.autocast)
        self.ckpt = frame
        try:
            out = fn(*args)
        finally:
            self.ckpt = None
        if not frame.nodes:
            frame.args = ()
        return out

    def _recompute(self, frame: CkptFrame) -> None:
        self.recomputing = frame
        frame.buf = []
        prev_kind, self.phase_kind = self.phase_kind, "temp"
        prev_ac = self.enter_autocast(frame.autocast)
        saved_cache = self.cast_cache
        self.cast_cache = {}
        try:
            frame.fn(*frame.args)
        except StopRecompute:
            pass
        finally:
            self.recomputing = None
            self.cast_cache = saved_cache
            self.autocast = prev_ac
            self.phase_kind = prev_kind
        buf = frame.buf
        k = 0
        for nd in frame.nodes:
            nd.saved = tuple(buf[k : k + nd.n_saved])
            k += nd.n_saved
        frame.buf = []
        frame.recomputed = True

    # ---- gathered parameter units (ZeRO-3 / FSDP FULL_SHARD) ---------------------------------------------
    def gather(self, unit: int | None, keep: tuple[int, ...] = ()) -> None:
        """All-gather the parameters of ``unit`` (and keep ``keep`` gathered: a prefetched unit); free every
        other gathered unit. Buffers are capped so that sharded + gathered never exceeds the full model."""
        self.unit = unit
        if not self.unit_bytes:
            return
        want = tuple(u for u in (unit, *keep) if u is not None and u in self.unit_bytes)
        for u in list(self.gathered):
            if u not in want:
                del self.gathered[u]
        for u in want:
            if u in self.gathered:
                continue
            live = sum(st.nbytes for st in self.gathered.values())
            n = max(0, min(self.unit_bytes[u], self.gather_cap - live))
            self.gathered[u] = self.storage(n, "gathered parameters", "param")

    def release_gathered(self) -> None:
        self.gathered.clear()
        self.unit = None

    # ---- backward engine ---------------------------------------------------------------------------------
    def backward(self, loss: T) -> None:
        """``loss.backward()``: run every node reachable from ``loss`` in the engine's order."""
        root = loss.fn
        if root is None:
            return
        deps: dict[Node, int] = {}
        stack = [root]
        seen = {root}
        while stack:
            nd = stack.pop()
            for e in nd.edges:
                if e is None:
                    continue
                nxt = e[0]
                deps[nxt] = deps.get(nxt, 0) + 1
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        del seen, stack
        buffers: dict[Node, list[Storage | None]] = {}
        ready: list[tuple[int, int, Node]] = []
        buffers[root] = [self.storage(4, "temporaries")]  # torch.ones_like(loss)
        heapq.heappush(ready, (-root.seq, 0, root))
        tie = 1
        tr = self.tr
        heappush, heappop = heapq.heappush, heapq.heappop
        sharded_units = bool(self.unit_bytes)
        while ready:
            nd = heappop(ready)[2]
            gout = buffers.pop(nd, None)
            if gout is None:
                gout = [None] * len(nd.out_meta)
            if nd.kind == "acc":
                self._accumulate(nd, gout[0])
                continue
            if sharded_units and nd.unit is not None and nd.unit != self.unit:
                # FSDP BACKWARD_PRE: gather this unit and prefetch the one before it
                self.gather(nd.unit, (nd.unit - 1,))
            if nd.saved is None and nd.frame is not None and not nd.frame.recomputed:
                self._recompute(nd.frame)
            tr.where = nd.where + " (backward)"
            grads = BACKWARD[nd.kind](self, nd, gout)
            del gout
            nd.saved = None
            nd.frame = None
            i = -1
            for e in nd.edges:
                i += 1
                if e is None:
                    continue
                g = grads[i]
                if g is not None:
                    want_n, want_dt = nd.in_meta[i]
                    want = round(want_n * DT_BYTES[want_dt])
                    if g.nbytes != want:
                        # validate_outputs: the gradient takes the input's dtype
                        g = self.storage(want, "temporaries")
                        grads[i] = g
                tgt, slot = e
                buf = buffers.get(tgt)
                if buf is None:
                    buf = [None] * len(tgt.out_meta)
                    buffers[tgt] = buf
                if g is not None:
                    if buf[slot] is None:
                        buf[slot] = g
                    else:
                        n_, dt_ = tgt.out_meta[slot]
                        s = self.storage(round(n_ * DT_BYTES[dt_]), "temporaries")
                        buf[slot] = s
                        del s
                g = None
                grads[i] = None
                d = deps[tgt] - 1
                deps[tgt] = d
                if d == 0:
                    heappush(ready, (-tgt.seq, tie, tgt))
                    tie += 1
            del grads

    def _accumulate(self, nd: Node, g: Storage | None) -> None:
        p = nd.param
        if p is None or g is None:
            return
        if self.main_grad or self.grads_offloaded:
            # added into the preallocated fp32 main_grad buffer, or copied to the CPU (ZeRO/FSDP offload):
            # the gradient on the GPU is dropped
            return
        if p.grad is None:
            if self.grad_shard > 1:
                # reduce-scatter: this rank keeps its 1/dp shard, the full gradient is freed
                p.grad = self.storage(-(-g.nbytes // self.grad_shard), "gradients", "grad")
            else:
                self.tr.retag(g, "grad", "gradients")
                p.grad = g
        # else: .grad += g in place (gradient accumulation), g is freed when it goes out of scope


# ---- backward formulas: what each node allocates ---------------------------------------------------------


def _st(sim: Sim, n: int, dt: str) -> Storage:
    return Storage(sim.tr, round(n * DT_BYTES[dt]), sim.phase_kind, "temporaries")


def _out_dt(nd: Node) -> str:
    return nd.out_meta[0][1]


def _needs(nd: Node, i: int) -> bool:
    return nd.edges[i] is not None


def bw_pass(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """Gradient flows through unchanged to every input (add, views, cat slices, scalar ops, clone)."""
    g = gout[0]
    return [None if e is None else g for e in nd.edges]


def bw_copy(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """One new gradient per input of the input's size (cast back, neg, slice_backward, silu/gelu backward,
    mean's expand/div, log_softmax/nll backward, a view's reshape copy)."""
    in_meta = nd.in_meta
    return [None if e is None else _st(sim, *in_meta[i]) for i, e in enumerate(nd.edges)]


def bw_linear(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """mm/addmm: grad_input = grad @ W, grad_weight = grad^T @ x, grad_bias = grad.sum(0) (all in the op's
    dtype; validate_outputs casts them afterwards when the inputs differ)."""
    dt = _out_dt(nd)
    in_meta = nd.in_meta
    out: list[Storage | None] = []
    for i, e in enumerate(nd.edges):
        out.append(None if e is None else _st(sim, in_meta[i][0], dt))
    return out


def bw_mul(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """grad_a = grad * b, grad_b = grad * a in the output dtype; a broadcast operand's gradient is computed at
    full size then summed down (sum_to_size)."""
    n_out, dt = nd.out_meta[0]
    out: list[Storage | None] = []
    for i in range(len(nd.edges)):
        if not _needs(nd, i):
            out.append(None)
            continue
        n_in = nd.in_meta[i][0]
        full = _st(sim, n_out, dt)
        if n_in < n_out:
            red = _st(sim, n_in, dt)
            del full
            out.append(red)
        else:
            out.append(full)
    return out


def bw_pow(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """pow_backward: grad * 2 * x^1 -> pow, mul, mul (the first two freed)."""
    n, dt = nd.in_meta[0]
    a = _st(sim, n, dt)
    b = _st(sim, n, dt)
    c = _st(sim, n, dt)
    del b, a
    return [c]


def bw_rsqrt(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """-0.5 * grad * result^3: pow, mul, mul."""
    n, dt = nd.in_meta[0]
    a = _st(sim, n, dt)
    b = _st(sim, n, dt)
    c = _st(sim, n, dt)
    del b, a
    return [c]


def bw_multi(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """Kernels returning one gradient per differentiable input (SDPA, layer_norm, grouped mm)."""
    return bw_copy(sim, nd, gout)


def bw_custom(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """A node whose ctx is a callable doing its own allocations (bitsandbytes, grouped_mm paths)."""
    fn: Callable[[Sim, Node, list[Storage | None]], list[Storage | None]] = nd.ctx
    return fn(sim, nd, gout)


BACKWARD: dict[str, Callable[[Sim, Node, list[Storage | None]], list[Storage | None]]] = {
    "pass": bw_pass,
    "copy": bw_copy,
    "split": bw_copy,
    "to": bw_copy,
    "linear": bw_linear,
    "mul": bw_mul,
    "pow": bw_pow,
    "rsqrt": bw_rsqrt,
    "multi": bw_multi,
    "custom": bw_custom,
}
