"""The backward engine of the symbolic runtime (``torch/csrc/autograd/engine.cpp``), and what each node's
backward allocates.

:func:`backward` runs every node reachable from the loss in the engine's order: ready nodes by descending
sequence number (``AccumulateGrad`` first), gradients of several consumers summed out of place
(``InputBuffer``), each node's incoming gradient freed when it returns and its saved tensors released right
after (``release_variables``), gradients cast to the input's dtype (``validate_outputs``), leaf gradients
handed to the framework hooks (``AccumulateGrad``: stolen into ``.grad``, added in place when ``.grad``
exists, or reduce-scattered under sharding). A node whose saved tensors sit in a checkpoint frame recomputes
that frame first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from gpumem_gui.core.replay.autograd import Node, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T


def _dependencies(root: Node) -> dict[Node, int]:
    """How many gradient edges lead into each node reachable from ``root`` (the engine's dependency count:
    a node runs once all its gradients have arrived)."""
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
    return deps


def backward(sim: Sim, loss: T) -> None:
    """``loss.backward()``: run every node reachable from ``loss`` in the engine's order."""
    root = loss.fn
    if root is None:
        return
    deps = _dependencies(root)
    buffers: dict[Node, list[Storage | None]] = {}
    ready: list[tuple[int, int, Node]] = []
    buffers[root] = [sim.storage(4, "temporaries")]  # torch.ones_like(loss)
    heapq.heappush(ready, (-root.seq, 0, root))
    tie = 1
    tr = sim.tr
    hooks = sim.hooks
    heappush, heappop = heapq.heappush, heapq.heappop
    while ready:
        nd = heappop(ready)[2]
        gout = buffers.pop(nd, None)
        if gout is None:
            gout = [None] * len(nd.out_meta)
        if nd.kind == "acc":
            g = gout[0]
            if nd.param is not None and g is not None:
                hooks.gradient_ready(sim, nd.param, g)
                if sim.post_accumulate is not None:
                    # register_post_accumulate_grad_hook: runs once .grad holds the gradient; the engine's
                    # own references to it are gone by then
                    g = gout = None
                    sim.post_accumulate(sim, nd.param)
            continue
        if nd.unit is not None and nd.unit != sim.unit:
            # FSDP BACKWARD_PRE: gather this unit and prefetch the one before it
            hooks.enter_unit(sim, nd.unit, (nd.unit - 1,))
        if nd.saved is None and nd.frame is not None and not nd.frame.recomputed:
            sim.recompute(nd.frame)
        tr.where = nd.where + " (backward)"
        unpacked = None if nd.packed is None else sim.offload.unpack(sim, nd)
        grads = BACKWARD[nd.kind](sim, nd, gout)
        del gout
        if unpacked is not None:
            sim.offload.node_done(unpacked)
            unpacked = None
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
                    g = sim.storage(want, "temporaries")
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
                    s = sim.storage(round(n_ * DT_BYTES[dt_]), "temporaries")
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
    if sim.offload is not None:
        sim.offload.backward_done()


def _st(sim: Sim, n: int, dt: str) -> Storage:
    return sim.storage(round(n * DT_BYTES[dt]), "temporaries")


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


# rsqrt's backward, -0.5 * grad * result^3, is also pow, mul, mul
bw_rsqrt = bw_pow


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
    "mm_float8": bw_custom,  # replay/tricks.py float8_linear
}
