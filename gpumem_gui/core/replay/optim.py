"""Optimizer states and the temporaries of one optimizer step, per implementation.

Each optimizer is described by what it keeps per parameter (states, their dtype) and by what its ``step()``
allocates on top (temporaries), read from the implementations:

* ``torch.optim.AdamW`` (torch/optim/adam.py, AdamW = Adam with decoupled weight decay): ``exp_avg`` and
  ``exp_avg_sq`` are ``zeros_like(param)`` (the parameter's dtype) plus a 0-dim ``step`` tensor (on the CPU
  unless
  fused/capturable). ``foreach`` (CUDA's default, ``_multi_tensor_adam``) computes
  ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`` for a whole dtype/device group at once: one temporary
  the size of the group. ``for_loop`` (``_single_tensor_adam``) evaluates
  ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)`` per parameter: two temporaries the size of the largest
  parameter. ``fused`` (``_fused_adamw_``) updates in place: none.
* bitsandbytes ``AdamW8bit`` / ``PagedAdamW8bit`` (bitsandbytes/optim/optimizer.py ``Optimizer2State``,
  ``optim_bits=8``, ``block_wise=True``, ``min_8bit_size=4096``): ``state1``/``state2`` uint8 plus an fp32
  ``absmax`` per 256-element block for each; parameters under 4096 elements keep fp32 states; the update is
  one
  fused kernel (no temporaries). Paged states live in CUDA unified memory (``cudaMallocManaged``), outside
  the torch allocator: they are not in the torch peak, and are reported apart; under memory pressure they
  are evicted to the CPU, but when paged in they still occupy GPU memory (bitsandbytes docs, "Paged
  optimizers").
* ``transformers.optimization.Adafactor`` (HF Trainer ``optim="adafactor"``, ``beta1=None``): a factored
  second
  moment ``exp_avg_sq_row`` [out] + ``exp_avg_sq_col`` [in] in fp32 for matrices, a full fp32 ``exp_avg_sq``
  for
  vectors; per parameter the step holds ``grad**2 + eps`` and the approximated ``update`` (and ``-update``),
  all
  fp32, plus fp32 copies of the gradient and the parameter when those are 16-bit.
* ``torch.optim.SGD`` (foreach): no state, in-place update; with momentum a ``momentum_buffer`` like the
  parameter, still updated in place.
* Lion (lion-pytorch ``update_fn``): ``exp_avg`` like the parameter; ``exp_avg.clone().mul_(b1).add(grad,
  alpha=1 - b1).sign_()`` holds two temporaries the size of the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from gpumem_gui.core.replay.autograd import Param, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage

OPTIMIZERS = (
    "adamw",
    "adamw-fused",
    "adamw-foreach",
    "adamw-for-loop",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw-32bit",
    "adafactor",
    "sgd",
    "sgd-momentum",
    "lion",
)

_BNB_BLOCK = 256
_BNB_MIN_8BIT = 4096
# bitsandbytes/optim/optimizer.py Optimizer8bit.get_state_buffer: a paged optimizer pages a state only when
# its parameter has at least 1e5 elements ("> 1 MB"); smaller ones get torch.zeros_like in the allocator
_BNB_MIN_PAGED = 100_000
# the paged optimizers: HF Trainer optim names paged_adamw_8bit / paged_adamw(_32bit) build bnb AdamW with
# is_paged = "paged" in optim and optim_bits = 8 if "8bit" in optim else 32 (transformers
# trainer_optimizer.py); PagedAdamW8bit / PagedAdamW32bit are Optimizer2State(is_paged=True)
PAGED = frozenset({"paged-adamw-8bit", "paged-adamw-32bit"})


@dataclass(frozen=True)
class OptimizerInfo:
    """How an optimizer is described to the user."""

    label: str
    states: str
    temporaries: str
    source: str


INFO: dict[str, OptimizerInfo] = {
    "adamw-foreach": OptimizerInfo(
        "AdamW (torch, foreach)",
        "exp_avg + exp_avg_sq, each like the parameter",
        "one temporary the size of a dtype/device group (torch._foreach_sqrt(exp_avg_sqs))",
        "torch/optim/adam.py _multi_tensor_adam",
    ),
    "adamw-fused": OptimizerInfo(
        "AdamW (torch, fused)",
        "exp_avg + exp_avg_sq, each like the parameter; step counters on the GPU",
        "none (in-place fused kernel)",
        "torch/optim/adam.py _fused_adam -> torch._fused_adamw_",
    ),
    "adamw-for-loop": OptimizerInfo(
        "AdamW (torch, for-loop)",
        "exp_avg + exp_avg_sq, each like the parameter",
        "two temporaries the size of the largest parameter (exp_avg_sq.sqrt() / bias_correction2_sqrt)",
        "torch/optim/adam.py _single_tensor_adam",
    ),
    "adamw-8bit": OptimizerInfo(
        "AdamW 8-bit (bitsandbytes)",
        "state1 + state2 uint8 and an fp32 absmax per 256 elements each (fp32 states under 4096 elements)",
        "none (fused blockwise kernel)",
        "bitsandbytes/optim/optimizer.py Optimizer2State.init_state (optim_bits=8, block_wise, "
        "min_8bit_size)",
    ),
    "paged-adamw-8bit": OptimizerInfo(
        "paged AdamW 8-bit (bitsandbytes)",
        "as AdamW 8-bit; the uint8 states of parameters of 1e5 elements or more in CUDA unified (paged) "
        "memory outside the torch allocator, not in the torch peak (fact paged_optimizer_state_bytes), the "
        "absmax and smaller parameters' states in it; paged in, they still occupy GPU memory, and are "
        "evicted to the CPU only under memory pressure",
        "none (fused blockwise kernel)",
        "bitsandbytes/optim/optimizer.py Optimizer2State (is_paged=True, get_paged); bitsandbytes docs "
        "(Paged optimizers: NVIDIA unified memory, automatic page-to-page transfers between CPU and GPU)",
    ),
    "paged-adamw-32bit": OptimizerInfo(
        "paged AdamW 32-bit (bitsandbytes)",
        "state1 + state2 fp32 (whatever the parameter's dtype); those of parameters of 1e5 elements or more "
        "in CUDA unified (paged) memory outside the torch allocator (fact paged_optimizer_state_bytes), the "
        "rest in it; paged in, they occupy GPU memory that nvidia-smi shows and "
        "torch.cuda.max_memory_allocated does not, and are evicted to the CPU only under memory pressure",
        "none (fused 32-bit kernel, optimizer_update_32bit)",
        "bitsandbytes/optim/optimizer.py Optimizer2State.init_state (optim_bits=32), get_state_buffer "
        "(numel >= 1e5: F.get_paged -> cudaMallocManaged); bitsandbytes/optim/adamw.py PagedAdamW32bit",
    ),
    "adafactor": OptimizerInfo(
        "Adafactor (transformers)",
        "fp32 factored second moment: row [out] + column [in] for matrices, full for vectors",
        "per parameter: grad**2+eps, update and -update in fp32 (+ fp32 copies of 16-bit grad and param)",
        "transformers/optimization.py Adafactor.step (beta1=None)",
    ),
    "sgd": OptimizerInfo("SGD (torch)", "none", "none (in-place foreach add)", "torch/optim/sgd.py"),
    "sgd-momentum": OptimizerInfo(
        "SGD with momentum (torch)",
        "momentum_buffer like the parameter",
        "none (in-place foreach updates)",
        "torch/optim/sgd.py _multi_tensor_sgd",
    ),
    "lion": OptimizerInfo(
        "Lion",
        "exp_avg like the parameter",
        "two temporaries the size of the largest parameter (clone, out-of-place add)",
        "lion-pytorch lion_pytorch.py update_fn",
    ),
}
INFO["adamw"] = INFO["adamw-foreach"]


def resolve(optimizer: str) -> str:
    return "adamw-foreach" if optimizer == "adamw" else optimizer


def state_bytes_of(optimizer: str, numel: int, shape: tuple[int, ...], dt: str) -> int:
    """Bytes of the optimizer state of one parameter of ``numel`` elements stored as ``dt``."""
    opt = resolve(optimizer)
    b = DT_BYTES[dt]
    if opt in ("adamw-foreach", "adamw-fused", "adamw-for-loop"):
        return round(2 * numel * b)
    return sum(_state_parts(opt, numel, shape, b))


def paged_state_bytes(optimizer: str, numel: int) -> int:
    """Bytes of one parameter's optimizer state a bitsandbytes paged optimizer puts in CUDA unified memory:
    ``state1`` / ``state2`` through ``get_state_buffer``, paged from 1e5 elements (``absmax`` is always
    ``torch.zeros``); 0 for every other optimizer or a smaller parameter."""
    opt = resolve(optimizer)
    if opt not in PAGED or numel < _BNB_MIN_PAGED:
        return 0
    return _state_parts(opt, numel, (numel,), 4)[0]


def _state_parts(opt: str, numel: int, shape: tuple[int, ...], b: float) -> tuple[int, ...]:
    """(bytes of the state tensors get_state_buffer makes, bytes of the rest) of one parameter."""
    if opt == "paged-adamw-32bit":  # Optimizer2State.init_state, optim_bits 32: two fp32 states
        return (2 * numel * 4, 0)
    if opt in ("adamw-8bit", "paged-adamw-8bit"):
        if numel < _BNB_MIN_8BIT:
            return (2 * numel * 4, 0)
        return (2 * numel, 2 * 4 * ceil(numel / _BNB_BLOCK))  # uint8 state1/state2; fp32 absmax1/absmax2
    return (_plain_state_bytes(opt, numel, shape, b), 0)


def _plain_state_bytes(opt: str, numel: int, shape: tuple[int, ...], b: float) -> int:
    if opt == "adafactor":
        if len(shape) >= 2:
            rows = numel // shape[-1]
            return 4 * (rows + shape[-1] * (numel // (shape[-1] * shape[-2])))
        return 4 * numel
    if opt in ("sgd-momentum", "lion"):
        return round(numel * b)
    return 0


def step_counter_bytes(optimizer: str, n_tensors: int) -> int:
    """0-dim fp32 ``step`` tensors: on the GPU only for fused AdamW (elsewhere they live on the CPU)."""
    return 4 * n_tensors if resolve(optimizer) == "adamw-fused" else 0


def states_total(
    optimizer: str,
    params: list[Param],
    shapes: dict[str, tuple[int, ...]],
    shard: int = 1,
    master_bytes_per_param: int = 0,
    flat: list[int] | None = None,
) -> int:
    """Bytes of the optimizer state of ``params`` on one rank (see :func:`create_states`); ``flat``: the
    optimizer holds instead one 1-D tensor per entry, of that many elements (DeepSpeed ZeRO's flat
    partitions, already this rank's: a 1-D tensor makes Adafactor's second moment unfactored,
    transformers/optimization.py ``Adafactor._get_options``: ``factored = len(param_shape) >= 2``)."""
    if flat is not None:
        dt = "f32" if master_bytes_per_param or not params else params[0].dt
        total = sum(state_bytes_of(optimizer, n, (n,), dt) + master_bytes_per_param * n for n in flat)
        return total + step_counter_bytes(optimizer, len(flat))
    total = 0
    for p in params:
        dt = "f32" if master_bytes_per_param else p.dt
        total += state_bytes_of(optimizer, p.numel, shapes.get(p.name, (p.numel,)), dt)
        total += master_bytes_per_param * p.numel
    return -(-total // shard) + step_counter_bytes(optimizer, len(params))


def outside_allocator(optimizer: str) -> bool:
    """Whether the optimizer keeps states outside the torch caching allocator: bitsandbytes' paged
    optimizers allocate the large ones with ``cudaMallocManaged`` (CUDA unified memory), which ``torch.cuda``
    does not count (bitsandbytes/optim/optimizer.py ``Optimizer8bit.get_state_buffer`` -> ``F.get_paged``;
    bitsandbytes docs, "Paged optimizers")."""
    return resolve(optimizer) in PAGED


def paged_total(optimizer: str, params: list[Param], shard: int = 1, flat: list[int] | None = None) -> int:
    """Bytes of the states of ``params`` a paged optimizer keeps in unified memory on one rank
    (:func:`paged_state_bytes` per parameter, or per flat partition); the rest of :func:`states_total` is
    in the torch allocator."""
    if not outside_allocator(optimizer):
        return 0
    if flat is not None:
        return sum(paged_state_bytes(optimizer, n) for n in flat)
    return -(-sum(paged_state_bytes(optimizer, p.numel) for p in params) // shard)


def create_states(
    sim: Sim,
    optimizer: str,
    params: list[Param],
    shapes: dict[str, tuple[int, ...]],
    shard: int = 1,
    master_bytes_per_param: int = 0,
    flat: list[int] | None = None,
) -> list[Storage]:
    """Allocate the optimizer state of every trainable parameter (what exists between steps); ``shard``:
    ZeRO-1+/FSDP ranks keep 1/shard of it; ``master_bytes_per_param``: an fp32 master copy (Megatron,
    DeepSpeed), whose states are then fp32 too; ``flat``: see :func:`states_total`. Paged states
    (:func:`paged_total`) are not allocated here: they are not in the torch peak."""
    total = states_total(optimizer, params, shapes, shard, master_bytes_per_param, flat)
    total -= paged_total(optimizer, params, shard, flat)
    return [sim.storage(total, "optimizer states", "optstate")] if total else []


def step(
    sim: Sim, optimizer: str, params: list[Param], shard: int = 1, fused: bool = False, master: bool = False
) -> None:
    """The temporaries of one ``optimizer.step()`` over ``params`` (gradients and states already live);
    a ZeRO/FSDP rank steps only its 1/shard of every group; ``fused``: a multi-tensor fused kernel (Megatron's
    FusedAdam) with no temporaries; ``master``: the optimizer steps fp32 master copies, so its temporaries are
    fp32 (DeepSpeed's flat partitions: :func:`step_flat`)."""
    opt = resolve(optimizer)
    if not params or fused:
        return
    if opt == "adamw-foreach":
        groups: dict[str, int] = {}
        for p in params:
            dt = "f32" if master else p.dt
            groups[dt] = groups.get(dt, 0) + round(p.numel * DT_BYTES[dt])
        for nbytes in groups.values():
            tmp = sim.storage(-(-nbytes // shard), "optimizer temporaries", "optstate")
            del tmp
        return
    largest = max(params, key=lambda p: p.numel * DT_BYTES[p.dt])
    if opt == "adafactor":  # its copies follow the parameter's own dtype
        worst = max(params, key=lambda p: p.numel)
        _hold(sim, _per_tensor_temporaries(opt, worst.numel, worst.dt))
    else:
        _hold(sim, _per_tensor_temporaries(opt, largest.numel, "f32" if master else largest.dt))


def step_flat(sim: Sim, optimizer: str, numel: int, dt: str, fused: bool = False) -> None:
    """The temporaries of one ``optimizer.step()`` whose parameter group holds ONE flat tensor of ``numel``
    elements of ``dt``: DeepSpeed ZeRO hands the wrapped torch optimizer this rank's flat partition
    (``deepspeed/runtime/zero/stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``: ``param_group['params']
    = [self.single_partition_of_fp32_groups[i]]``; ``stage3.py`` ``_optimizer_step``: ``[fp32_param]`` per
    sub-group), so the temporaries :func:`step` sizes per parameter are made over the whole partition:
    foreach's ``torch._foreach_sqrt`` over the one-tensor list, the for-loop's ``exp_avg_sq.sqrt()`` and its
    quotient (torch/optim/adam.py ``_single_tensor_adam``). Fused kernels (``fused``, torch's fused AdamW,
    DeepSpeed's FusedAdam) make none."""
    opt = resolve(optimizer)
    if fused or numel <= 0:
        return
    if opt == "adamw-foreach":
        _hold(sim, (round(numel * DT_BYTES[dt]),))
        return
    _hold(sim, _per_tensor_temporaries(opt, numel, dt))


def _per_tensor_temporaries(opt: str, numel: int, dt: str) -> tuple[int, ...]:
    """Bytes of the temporaries one tensor's update holds at once, for the optimizers that update one tensor
    at a time: for-loop AdamW and Lion two like the tensor (see :data:`INFO`), Adafactor grad**2+eps and the
    update (and its negation, and fp32 copies of a 16-bit grad and param) in fp32; the in-place ones none."""
    if opt in ("adamw-for-loop", "lion"):
        nb = round(numel * DT_BYTES[dt])
        return (nb, nb)
    if opt == "adafactor":
        return (4 * numel,) * (4 if dt != "f32" else 2)
    return ()  # fused AdamW, 8-bit AdamW, SGD (+momentum): in-place kernels


def _hold(sim: Sim, sizes: tuple[int, ...]) -> None:
    """Allocate temporaries of ``sizes`` bytes, live together, then free them."""
    held = [sim.storage(n, "optimizer temporaries", "optstate") for n in sizes]
    del held
