"""A chunked recurrent scan replayed in a number of steps that does not grow with the sequence.

The linear-attention kernels of transformers' torch fallback (the gated delta rule's chunk loop,
:mod:`.delta_rule`; Kimi Delta Attention's, :mod:`.kda`; MiniMax's lightning blocks, :mod:`.lightning`) walk
the padded sequence chunk by chunk, and under autograd every iteration leaves the same bytes behind (its saved
tensors: casts of the chunk's slices, the recurrent state it read) while its temporaries come and go in the
same pattern. Replaying every chunk costs time and memory linear in the sequence (4,096 iterations per layer
at 262k tokens). :func:`run_scan` replays iterations until two in a row leave the same bytes behind (by kind
and tag; the first reads a state of zeros that needs no gradient), stands for the middle ones with one
*ballast* of that many times those bytes, replays one more iteration and the last ``TAIL`` ones.

Why the peaks are the same to the byte. Forward: each middle iteration raises the live bytes by the same
amount and repeats the same temporaries, so each one's highest point is below the next one's, and the last
``TAIL`` iterations (replayed) end higher than any of them; after the ballast the live bytes are what they
were after the middle iterations. Backward: the engine runs an iteration's nodes (higher sequence numbers)
before the earlier ones'; the ballast hangs on a node made just before the replayed middle iteration, so it is
freed once that iteration's nodes (and its slices' full-size gradients, summed out of place) are done, exactly
when the old replay would have started on the iterations it stands for. Those would have repeated the same
temporaries over a baseline lower by one iteration's bytes each time (the gradient buffers they add into exist
from the first iteration processed on), so none of them was a peak. ``tests/test_scan_bulk.py`` compares both
replays on many points, byte for byte.

Under activation checkpointing the first forward holds nothing the nodes save and the recomputation in the
backward holds it all: both make the same nodes (``CKPT_HEAD`` iterations, then the ballast as one saved
storage, empty in the first pass and filled in the recomputation), so the saved tensors reach the right nodes.

Not used (every iteration replayed) under activation offload (its hooks move each saved tensor), with a
selective checkpoint policy (it keeps some outputs of every op it sees), without autograd (the delta rules
replay two iterations then; MiniMax's inference forward still walks every block), when an iteration leaves
bytes of more than one kind or a negative amount of a tag, or for a few chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.autograd import Sim

MAX_HEAD = 6  # replayed first, until two in a row leave the same bytes (the first reads a state of zeros)
TAIL = 3  # replayed last: the backward runs them first and sets up the gradient buffers
ENABLED = True  # tests/test_scan_bulk.py turns it off to compare with replaying every iteration


CKPT_HEAD = 4  # under checkpointing: replayed first, a fixed number (the first forward and the recomputation
# must make the same nodes, while only the recomputation holds what they save); the last one is measured


def _mode(s: Sim, n: int) -> str | None:
    """How to stand for the middle iterations: ``plain`` (autograd, nothing checkpointed), ``ckpt`` (the
    first forward of a checkpointed region: nothing saved is held), ``recompute`` (its recomputation in
    the backward), or None: replay every iteration (activation offload, a selective checkpoint policy that
    keeps some outputs, no autograd, a few chunks)."""
    if not ENABLED or not s.grad_enabled or n <= CKPT_HEAD + TAIL + 1:
        return None
    if s.recomputing is not None:
        return "recompute" if s.recomputing.policy is None and s.offload is None else None
    if s.ckpt is not None:
        return "ckpt" if s.ckpt.policy is None and s.offload is None else None
    off = s.offload
    return "plain" if off is None or not off.active else None


def _left_behind(s: Sim, before: tuple[dict[str, int], dict[str, int]]) -> tuple[str, dict[str, int]] | None:
    """(kind, bytes by tag) one iteration left behind since ``before``; None when it cannot stand for more
    iterations (bytes of several kinds, a tag that shrank)."""
    tr = s.tr
    kinds = {k: v - before[0].get(k, 0) for k, v in tr.by_kind.items() if v != before[0].get(k, 0)}
    tags = {k: v - before[1].get(k, 0) for k, v in tr.by_tag.items() if v != before[1].get(k, 0)}
    if len(kinds) > 1 or any(v < 0 for v in (*kinds.values(), *tags.values())):
        return None
    if not kinds:
        return ("act", {})
    return next(iter(kinds)), tags


def _steps(step: Callable[[int, Any], Any], carry: Any, start: int, stop: int) -> Any:
    """Iterations ``start`` to ``stop - 1`` replayed one by one."""
    for k in range(start, stop):
        carry = step(k, carry)
    return carry


def run_scan(
    s: Sim,
    n: int,
    step: Callable[[int, Any], Any],
    carry: Any,
    state: Callable[[Any], T],
    collected: list[T] | None = None,
) -> Any:
    """``carry = step(it, carry)`` for ``it`` in ``range(n)``, in at most ``MAX_HEAD + 1 + TAIL`` steps
    (see the module docstring); ``state(carry)`` is the recurrent state tensor an iteration reads, on which
    the ballast hangs. ``step`` is told the real iteration number (its last one is special). ``collected``:
    a list each iteration appends its output to (kept until the caller concatenates them, not until the
    backward): the middle iterations' outputs join it as one tensor of their bytes."""
    mode = _mode(s, n)
    if mode is None:
        carry = _steps(step, carry, 0, n)
        return carry
    if mode != "plain":
        return _run_checkpointed(s, n, step, carry, state, collected, mode == "recompute")
    tr = s.tr
    it, prev, each = 0, None, None
    while it < n:  # replay until two iterations in a row leave the same bytes behind (a steady one)
        before = (dict(tr.by_kind), dict(tr.by_tag))
        carry = step(it, carry)
        it += 1
        each = _left_behind(s, before)
        if each is not None and each == prev:
            break
        prev = each
        if it >= MAX_HEAD:
            each = None
            break
    middle = n - it - TAIL - 1  # iterations the ballast stands for
    if each is None or middle < 1 or state(carry).fn is None:
        carry = _steps(step, carry, it, n)
        return carry
    kind, by_tag = each
    if collected is not None:  # the output each iteration appends is no saved tensor
        out = collected[-1]
        if out.st is None or out.st.kind != kind or by_tag.get(out.st.tag, 0) < out.st.nbytes:
            carry = _steps(step, carry, it, n)
            return carry
        by_tag = {**by_tag, out.st.tag: by_tag[out.st.tag] - out.st.nbytes}
        collected.append(T(s.storage(middle * out.st.nbytes, out.st.tag, kind), middle * out.n, out.dt))
    ballast = tuple(s.storage(middle * b, tag, kind) for tag, b in by_tag.items() if b)
    last = state(carry)
    alias = T(last.st, last.n, last.dt)
    s.node("pass", (last,), (alias,), saved=ballast)  # freed when the backward reaches this node
    carry = _replace_state(carry, last, alias)
    del ballast, last, alias  # the state lives as long as the loop keeps it, no longer
    carry = step(it + middle, carry)
    carry = _steps(step, carry, it + middle + 1, n)
    return carry


def _run_checkpointed(
    s: Sim,
    n: int,
    step: Callable[[int, Any], Any],
    carry: Any,
    state: Callable[[Any], T],
    collected: list[T] | None,
    held: bool,
) -> Any:
    """:func:`run_scan` inside a checkpointed region: ``CKPT_HEAD`` iterations, then the ballast as ONE saved
    storage on the state's node (the first forward counts it and drops it; the recomputation, ``held``,
    fills it with the middle iterations' bytes, measured on the last head iteration), then the rest."""
    tr = s.tr
    carry = _steps(step, carry, 0, CKPT_HEAD - 1)
    before = (dict(tr.by_kind), dict(tr.by_tag))
    carry = step(CKPT_HEAD - 1, carry)
    middle = n - CKPT_HEAD - TAIL - 1
    tags = {k: v - before[1].get(k, 0) for k, v in tr.by_tag.items() if v > before[1].get(k, 0)}
    if collected is not None:  # each iteration's output, kept in the list in either pass
        out = collected[-1]
        assert out.st is not None
        if out.st.tag in tags:
            tags[out.st.tag] -= out.st.nbytes
        collected.append(
            T(s.storage(middle * out.st.nbytes, out.st.tag, out.st.kind), middle * out.n, out.dt)
        )
    tag = max(tags, key=lambda k: tags[k]) if tags else s.region
    each = sum(b for b in tags.values() if b > 0) if held else 0
    ballast = s.storage(middle * each, tag, s.phase_kind)
    last = state(carry)
    alias = T(last.st, last.n, last.dt)
    s.node("pass", (last,), (alias,), saved=(ballast,))
    carry = _replace_state(carry, last, alias)
    del ballast, last, alias  # the state lives as long as the loop keeps it, no longer
    carry = step(CKPT_HEAD + middle, carry)
    carry = _steps(step, carry, CKPT_HEAD + middle + 1, n)
    return carry


def _replace_state(carry: Any, old: T, new: T) -> Any:
    if carry is old:
        return new
    if isinstance(carry, tuple):
        return tuple(new if c is old else c for c in carry)
    if isinstance(carry, dict):  # in place: the caller's dict is the loop's variables (no second copy)
        for k, c in carry.items():
            if c is old:
                carry[k] = new
        return carry
    raise TypeError("the carry holds its state as itself, in a tuple or in a dict")
