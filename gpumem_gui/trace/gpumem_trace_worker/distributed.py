"""Training per rank of a data-parallel job: FSDP2, DDP and DDP + ZeRO-1, one process playing rank 0.

Torch's fake process group (``torch.testing._internal.distributed.fake_pg``) returns every collective at once
without moving data, so each wrapper allocates exactly what it allocates on a real rank (FSDP2's all-gather
outputs and reduce-scatter buffers, DDP's gradient buckets), and nothing is communicated. FSDP2
``fully_shard`` runs on a CPU device mesh. The second iteration is measured (steady state: the optimizer
states exist; the first one creates them).

* ``fsdp`` = ``full_shard``: ``fully_shard`` per decoder layer and on the root, resharding after forward;
  ``shard_grad_op``: the same without resharding after forward; ``hybrid_shard``: sharding over a node's
  ``gpus_per_node`` ranks (the replicas across nodes change nothing on one rank but the all-reduce);
* ``zero = 1``: DDP with ``ZeroRedundancyOptimizer(AdamW)`` (states partitioned by whole parameters);
* otherwise ``dp > 1``: DDP (``gradient_as_bucket_view=False``, the default).

DDP needs three shims under fake tensors, none of which changes an allocation: its constructor-time shape
check reads tensor data (skipped; ``init_sync=False`` skips the initial broadcast, a no-op on the fake group);
the fake group's all-reduce future carries no tensor (the debugging ``noop_hook`` returns the bucket the
default hook would all-reduce in place); the one-time bucket rebuild of the second iteration reads index
tensors (skipped; later iterations never rebuild, and the bucket bytes are the same).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from .building import TraceError, add_vision, quantization_notes, readable_failures
from .tracking import fsdp_tracker, memory_tracker, restart_peaks
from .training import optimizer, precision_dtypes, prepare


def _world(run: dict[str, Any]) -> int:
    dp = int(run.get("dp", 1))
    if run.get("fsdp") == "hybrid_shard":
        return max(1, min(dp, int(run.get("gpus_per_node", 8))))
    return dp


def _check(run: dict[str, Any]) -> str:
    zero, fsdp = int(run.get("zero", 0) or 0), run.get("fsdp", "none")
    if zero > 1:
        raise TraceError(f"ZeRO-{zero} is DeepSpeed's, which is not traced (ZeRO-1 is, as torch's)")
    if run.get("offload", "none") != "none":
        raise TraceError("CPU offload is not traced")
    if fsdp != "none":
        return "fsdp"
    return "zero1" if zero == 1 else "ddp"


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers: the longest ModuleList of the model (wrapped by peft or not)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise TraceError("no decoder layer list found to shard")
    return list(max(lists, key=len))


@contextlib.contextmanager
def _fake_group(world: int) -> Any:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fsdp(model: Any, run: dict[str, Any], mesh: Any) -> tuple[Any, Any]:
    from torch.distributed.fsdp import fully_shard

    reshard = run.get("fsdp") != "shard_grad_op"
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params, run.get("optimizer", "adamw"))
    return fsdp_tracker(model, opt), opt


def _ddp(model: Any, run: dict[str, Any], zero1: bool) -> tuple[Any, Any]:
    import torch
    import torch.nn.parallel.distributed as ddp_module
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel

    class NoRebuild:  # the reducer, but for its one-time bucket rebuild (it reads index tensors)
        def __init__(self, reducer: Any) -> None:
            object.__setattr__(self, "_r", reducer)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._r, name)

        def _rebuild_buckets(self) -> bool:
            return False

    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=False, init_sync=False)
    ddp.register_comm_hook(None, noop_hook)
    ddp.reducer = NoRebuild(ddp.reducer)
    params = [p for p in ddp.parameters() if p.requires_grad]
    if not zero1:
        return ddp, optimizer(params, run.get("optimizer", "adamw"))
    if run.get("optimizer", "adamw") not in ("adamw", "adamw-foreach"):
        raise TraceError("ZeRO-1 is traced with AdamW (foreach) only")
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ddp, ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-5, foreach=True)


def _iterations(module: Any, opt: Any, mt: Any, ids: Any, autocast: Any) -> None:
    """Two optimizer steps; the peaks of the second are kept."""
    import torch

    for last in (False, True):
        if last:
            restart_peaks(mt)
        mt.phase = "forward" if last else "warmup"
        ac = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ac:
            loss = module(input_ids=ids, labels=ids, use_cache=False).loss
        mt.phase = "backward" if last else "warmup"
        loss.backward()
        del loss
        mt.phase = "optimizer" if last else "warmup"
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not last:
            mt.reset_mod_stats()


def trace_data_parallel(raw: dict[str, Any], run: dict[str, Any], trust: bool) -> dict[str, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    strategy, world = _check(run), _world(run)
    notes: list[str] = [f"rank 0 of {world} under torch's fake process group ({strategy})"]
    out: dict[str, Any] = {
        "notes": notes,
        "quantization": quantization_notes(raw, notes),
        "world_size": world,
    }
    with _fake_group(world), readable_failures():
        # the mesh is made from real tensors, outside the fake mode
        mesh = init_device_mesh("cpu", (world,)) if strategy == "fsdp" else None
        with FakeTensorMode():
            _trace_rank(raw, run, trust, strategy, mesh, out)
    gc.collect()
    return out


def _trace_rank(
    raw: dict[str, Any], run: dict[str, Any], trust: bool, strategy: str, mesh: Any, out: dict[str, Any]
) -> None:
    cfg, model, ids = prepare(raw, run, trust, out)
    weights, autocast = precision_dtypes(run)
    if strategy == "fsdp":
        mt, opt = _fsdp(model, run, mesh)
        mt.track_inputs((ids,))
        with mt:
            _iterations(model, opt, mt, ids, autocast)
    else:
        mt = memory_tracker()
        mt.track_external(model, ids)
        with mt:  # entered before DDP is built, so the reducer's gradient buckets are seen
            module, opt = _ddp(model, run, strategy == "zero1")
            _iterations(module, opt, mt, ids, autocast)
    out["phases"] = {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
    add_vision(out, cfg, weights, out["world_size"] if strategy == "fsdp" else 1)
