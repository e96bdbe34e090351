"""Framework memory tricks on the symbolic runtime: activation offloading, the optimizer stepped in backward,
float8 linears and compiled (fused) norms.

* :class:`Offloader` is torchtune's ``OffloadActivations`` (``torchtune/training/_activation_offloading.py``,
  defaults ``use_streams=True``, ``use_pin_memory=True``, ``max_fwd_stash_size=5``,
  ``min_offload_size=1024``) as ``saved_tensors_hooks`` on the replay: a saved tensor of at least 1024 bytes
  that is not a parameter is copied to CPU RAM (one copy per pack, no de-duplication) and the node keeps only
  an id; the last 5 packs' originals stay referenced on the GPU (``fwd_stash``) while the copy-out stream
  runs; in backward each node's offloaded tensors are brought back as new GPU tensors, kept until the
  *next* node that unpacks has run (``bwd_tensor_stash``, freed in that node's post hook), all freed at the
  end of backward (``queue_callback``). A checkpointed layer's positional inputs (``_NoopSaveInputs`` in
  ``torch/utils/checkpoint.py``) go through the same hooks. The output head and the loss run outside them
  (torchtune's ``NoOpManager`` around ``model.output``; the loss is computed after the context exits).
* :func:`optimizer_in_backward` is torchtune's ``optimizer_in_bwd``
  (``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks``): one optimizer per parameter, stepped
  and zeroed (``set_to_none``) by a ``register_post_accumulate_grad_hook`` as soon as its gradient is
  accumulated.
* :func:`float8_linear` is torchao's ``Float8Linear`` with tensorwise dynamic scaling
  (``torchao/float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``): it saves the high-precision input
  and weight (as ``nn.Linear`` does) and casts both to float8 for the forward matmul, the output gradient,
  weight and input again in backward (transient 1-byte copies).
* :func:`compiled_rms_norm`, :func:`fused_pointwise`: compiled decoder layers (``torch.compile``, Inductor).
  Inductor fuses a chain of pointwise ops into one kernel, and the min-cut partitioner
  (``torch/_functorch/partitioners.py`` ``min_cut_rematerialization_partition``) saves for backward only
  what is cheapest to keep: a pointwise op's output is recomputed in backward (``is_fusible``) unless a
  non-fusible backward op (a matmul) reads it (``should_ban_recomputation``:
  ``is_materialized_backwards``), and a reduction's small output is saved (``ban_if_reduction``). So the
  RMSNorm keeps its input and the fp32 reciprocal RMS per row (the fp32 upcast, square, mean and product
  are neither materialised nor saved); the gated activation ``act(gate) * up`` keeps gate and up (the
  activation's output is recomputed; the product, which ``down_proj``'s weight gradient reads, is saved
  by that linear as before); the rotary embedding keeps only its cos / sin tables, with no temporaries.
  Each is measured with Inductor on the CPU (tests/reference/distributed/compile.json,
  validation/truth_compile.py; tests/test_compile.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumem_gui.core.replay.autograd import Node, Param, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T, promote
from gpumem_gui.core.replay.optim import create_states, step

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM

OFFLOAD_MIN_BYTES = 1024  # OffloadActivations(min_offload_size=1024)
OFFLOAD_STASH = 5  # OffloadActivations(max_fwd_stash_size=5)


class Offloader:
    """torchtune's activation offloading as the replay's saved-tensor hooks (see the module docstring).
    ``active`` while the decoder runs; ``host_peak``: the most bytes held in CPU RAM at once."""

    def __init__(self, inputs_only: bool = False) -> None:
        self.active = False
        # unsloth's offloaded gradient checkpointing: only checkpointed layer inputs, copied out and dropped
        self.inputs_only = inputs_only
        self.ids = 0
        self.fwd_stash: dict[int, Storage] = {}
        self.prev: list[Storage] = []  # bwd_tensor_stash: copies brought back for the previous node
        self.host = 0
        self.host_peak = 0

    def _offload(self, st: Storage) -> int:
        self.ids += 1
        tid = self.ids
        self.host += st.nbytes
        self.host_peak = max(self.host_peak, self.host)
        if self.inputs_only:
            return tid
        for k in list(self.fwd_stash):  # sync and drop originals offloaded long enough ago
            if k > tid - OFFLOAD_STASH:
                break
            del self.fwd_stash[k]
        self.fwd_stash[tid] = st
        return tid

    def pack(
        self, sts: tuple[Storage, ...], kind: str = ""
    ) -> tuple[tuple[Storage, ...], tuple[tuple[int, int], ...] | None]:
        """What a node of ``kind`` keeps on the GPU, and the (id, bytes) of what went to the CPU (None:
        nothing). A parameter saved as itself (a norm's weight) is kept (``isinstance(t, nn.Parameter)``); a
        matmul saves ``weight.t()``, a view that is no ``nn.Parameter``, so linears' weights are offloaded
        too (and copied back for their backward)."""
        if self.inputs_only:
            return sts, None
        views = kind in ("linear", "custom", "mm_float8")
        kept: list[Storage] = []
        packed: list[tuple[int, int]] = []
        for st in sts:
            if (st.kind == "param" and not views) or st.nbytes < OFFLOAD_MIN_BYTES:
                self.ids += 1  # every pack takes an id (get_tensor_id), offloaded or not
                kept.append(st)
            else:
                packed.append((self._offload(st), st.nbytes))
        return tuple(kept), (tuple(packed) or None)

    def pack_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A checkpointed layer's inputs: the hidden states (the layer call's one positional tensor,
        transformers' GradientCheckpointingLayer binds the rest as keyword arguments) go to the CPU; the
        frame keeps a storage-less stand-in with the id."""
        out = list(args)
        for j, a in enumerate(args):
            if not isinstance(a, T) or a.st is None:
                continue
            if a.st.kind == "param" or a.st.nbytes < OFFLOAD_MIN_BYTES:
                self.ids += 1
            else:
                stand_in = T(None, a.n, a.dt, a.fn is not None, a.fn, a.idx)
                stand_in.param = _Packed(self._offload(a.st), a.st.nbytes)  # type: ignore[assignment]
                out[j] = stand_in
            break  # only the first tensor is positional
        return tuple(out)

    def unpack_args(self, sim: Sim, args: tuple[Any, ...]) -> tuple[Any, ...]:
        out = list(args)
        for j, a in enumerate(args):
            if isinstance(a, T) and a.st is None and isinstance(a.param, _Packed):
                st = self._bring_back(sim, a.param.tid, a.param.nbytes)
                out[j] = T(st, a.n, a.dt, a.fn is not None, a.fn, a.idx)
        return tuple(out)

    def _bring_back(self, sim: Sim, tid: int, nbytes: int) -> Storage:
        st = self.fwd_stash.get(tid)
        self.host -= nbytes
        if st is not None:
            return st
        return sim.storage(nbytes, "temporaries", "temp")

    def unpack(self, sim: Sim, nd: Node) -> list[Storage]:
        """The node's offloaded tensors back on the GPU (stashed originals are used as they are)."""
        return [self._bring_back(sim, tid, nb) for tid, nb in nd.packed]

    def node_done(self, copies: list[Storage]) -> None:
        """The post hook of a node that unpacked: the forward stash and the previous node's copies go."""
        self.fwd_stash.clear()
        self.prev = copies

    def backward_done(self) -> None:
        self.fwd_stash.clear()
        self.prev = []


class _Packed:
    """The id of an offloaded checkpoint input (carried by its stand-in tensor)."""

    __slots__ = ("nbytes", "tid")

    def __init__(self, tid: int, nbytes: int) -> None:
        self.tid, self.nbytes = tid, nbytes


def optimizer_in_backward(
    optimizer: str,
    shard: int,
    create: bool,
    shapes: dict[str, tuple[int, ...]],
    master_bytes_per_param: int,
    states: list[Storage],
) -> Callable[[Sim, Param], None]:
    """The post-accumulate-grad hook of every parameter: ``optim_dict[p].step()`` (its states made on the
    first step, kept in ``states``) then ``optim_dict[p].zero_grad()`` (the gradient freed)."""

    def hook(sim: Sim, p: Param) -> None:
        prev = sim.tr.where
        sim.tr.where = "optimizer step (in backward)"
        if create:
            states.extend(create_states(sim, optimizer, [p], shapes, shard, master_bytes_per_param))
        step(sim, optimizer, [p], shard)
        p.grad = None
        sim.tr.where = prev

    return hook


def _fp8_copies(sim: Sim, sizes: tuple[int, ...], hp: str | None, compiled: bool) -> None:
    """Tensorwise dynamic casts to float8 (``hp_tensor_to_float8_dynamic``): eager, ``tensor_to_scale``
    takes ``torch.max(torch.abs(x))`` (a high-precision temporary) and ``to_fp8_saturated`` clamps
    ``x * scale``
    (two more); compiled, one fused kernel writes the 1-byte copy. The copies die with the matmul."""
    held = []
    for n in sizes:
        if not compiled and hp is not None:
            a = sim.new(n, hp, "temporaries")
            del a
            scaled = sim.new(n, hp, "temporaries")
            clamped = sim.new(n, hp, "temporaries")
            del scaled
            held.append(sim.new(n, "u8", "temporaries"))
            del clamped
        else:
            held.append(sim.new(n, "u8", "temporaries"))
    del held


def float8_linear(m: CausalLM, x: T, w: T, bias: T | None, n_out: int, n_in: int) -> T:
    """torchao Float8Linear forward: saves (input, weight) in high precision like nn.Linear; the float8 copies
    of both are transient, and backward casts the output gradient, the weight and the input again."""
    s, compiled = m.s, m.cfg.compile
    x = s.ac_cast(x)  # type: ignore[assignment]
    w = s.ac_cast(w)  # type: ignore[assignment]
    rows = x.n // n_in
    _fp8_copies(s, (x.n, w.n), x.dt, compiled)
    out = s.new(rows * n_out, x.dt)
    saved = [t for t, other in ((w, x), (x, w)) if other.fn is not None]
    sizes = (rows * n_out, w.n, x.n)  # sizes only: the closure must not keep the tensors alive

    def backward(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
        dt = nd.out_meta[0][1]
        _fp8_copies(sim, sizes, dt, compiled)
        return [
            None if e is None else sim.storage(round(nd.in_meta[i][0] * DT_BYTES[dt]), "temporaries")
            for i, e in enumerate(nd.edges)
        ]

    # "mm_float8": the selective-AC policy sees this matmul as the aten.mm it dispatches (OpSelectiveAC)
    s.node("mm_float8", (x, w, bias), (out,), tuple(saved), ctx=backward)
    return out


def compiled_rms_norm(m: CausalLM, x: T, w: T) -> T:
    """A fused RMSNorm (torch.compile): the output in the input dtype (the weight's when it promotes), the
    fp32 reciprocal RMS per row; backward is one fused kernel writing the input's and the weight's
    gradients."""
    s = m.s
    width = w.n
    rows = x.n // width
    out_dt = x.dt if x.dt == w.dt else "f32"
    out = s.new(x.n, out_dt)
    rstd = s.new(rows, "f32")
    s.node("multi", (x, w), (out,), (x, w, rstd))
    return out


def fused_pointwise(s: Sim, inputs: tuple[T, ...], saved: tuple[T, ...], out_dt: str | None = None) -> T:
    """One Inductor kernel over a pointwise chain of ``inputs`` (broadcast to the largest; the dtype they
    promote to, or ``out_dt`` where the chain ends in a cast): only its output is made; backward is one
    fused kernel writing a gradient per input that needs one, of its size and dtype. ``saved``: what the
    partitioner keeps. (A ``custom`` node: op-level selective checkpointing recomputes it, as torchtitan's
    policy saves no pointwise op.)"""
    dt = inputs[0].dt
    for x in inputs[1:]:
        dt = dt if x.dt == dt else promote(dt, x.dt)
    out = s.new(max(x.n for x in inputs), out_dt or dt)
    s.node("custom", inputs, (out,), saved, ctx=_grad_per_input)
    return out


def _grad_per_input(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    return [
        None
        if e is None
        else sim.storage(round(nd.in_meta[i][0] * DT_BYTES[nd.in_meta[i][1]]), "temporaries")
        for i, e in enumerate(nd.edges)
    ]


class OpSelectiveAC:
    """torchtitan's op-level selective activation checkpointing policy (``torchtitan/distributed/
    activation_checkpoint.py`` ``SelectiveAC._get_custom_policy``, before 114151ad ``_apply_op_sac``) for one
    checkpointed layer: outputs of the ops in ``_get_default_save_ops`` are saved (MUST_SAVE) and the rest
    recomputed, except that every second ``mm``/``linear`` is recomputed too. A linear with a bias runs as
    ``addmm``: saved (a compute-intensive op of ``torch/_functorch/partitioners.py`` ``get_default_op_list``)
    and not counted among the mm's. The SDPA kernel's outputs (output and log-sum-exp) are saved; eager
    attention's ``bmm``s are treated as linears. A fresh policy (a fresh mm count) per layer call, as
    ``context_fn`` builds one per checkpoint.

    A float8 linear (``mm_float8``) is counted as an ``mm`` too, whatever its bias: torchao's
    ``matmul_with_hp_or_float8_args.forward`` calls ``torch.mm`` on the float8 tensor subclass (the bias is
    added after, ``output + self.bias``), and the checkpoint's dispatch mode, above the subclass, sees that
    ``aten.mm.default`` (``torch/utils/checkpoint.py`` ``_CachingTorchDispatchMode.__torch_dispatch__``;
    compiled, the same policy tags every graph node the op emits, the subclass's ``_scaled_mm`` included). Its
    high-precision output is what is saved; the casts (``abs``, ``max``, the scaled copy) are recomputed, the
    ``max`` scalar's save being negligible."""

    def __init__(self) -> None:
        self.mm = 0

    def __call__(
        self, sim: Sim, kind: str, inputs: tuple[T | None, ...], outputs: tuple[T, ...], frame: Any
    ) -> None:
        if kind == "linear" or kind == "mm_float8":
            if kind == "mm_float8" or len(inputs) < 3 or inputs[2] is None:  # mm: every second recomputed
                self.mm += 1
                if self.mm % 2 == 0:
                    return
        elif not (kind == "multi" and sim.region == "attention"):
            return
        frame.keep.extend(o.st for o in outputs if o.st is not None)
