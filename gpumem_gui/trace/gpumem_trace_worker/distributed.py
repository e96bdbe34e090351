"""Training per rank of a data-parallel job: FSDP2, DDP and DDP + ZeRO-1, one process playing one rank.

Torch's fake process group (``torch.testing._internal.distributed.fake_pg``) returns every collective at once
without moving data, so each wrapper allocates exactly what it allocates on a real rank (FSDP2's all-gather
outputs and reduce-scatter buffers, DDP's gradient buckets), and nothing is communicated. FSDP2
``fully_shard`` runs on a CPU device mesh. The second iteration is measured (steady state: the optimizer
states exist; the first one creates them).

* ``fsdp`` = ``full_shard``: FSDP2 ``fully_shard`` per decoder layer (``fsdp_units``: and on the embedding /
  the head) and on the root, resharding after forward
  (``reshard_size`` N: ``reshard_after_forward=N``); ``shard_grad_op``: the same without resharding after
  forward; ``hybrid_shard``: sharding over a node's ``gpus_per_node`` ranks (the replicas across nodes change
  nothing on one rank but the all-reduce); ``precision = mp-bf16``: an fp32 model under
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; FSDP1 is refused;
* ``zero = 1`` with ``zero_impl = torch``: DDP with ``ZeroRedundancyOptimizer(AdamW)`` (states partitioned by
  whole parameters, greedily by size); the traced rank is the one holding the most parameters (the rank that
  decides the fit), found from the optimizer's own partition;
* otherwise ``dp > 1``: DDP with the run's ``bucket_cap_mb`` and ``gradient_as_bucket_view`` (``bucket_view``;
  torch's default: False).

DDP needs three shims under fake tensors, none of which changes an allocation: its constructor-time shape
check reads tensor data (skipped; ``init_sync=False`` skips the initial broadcast, a no-op on the fake group);
the fake group's all-reduce future carries no tensor (the debugging ``noop_hook`` returns the bucket the
default hook would all-reduce in place); the one-time bucket rebuild of the second iteration reads index
tensors (skipped; later iterations never rebuild, and the bucket bytes are the same). So that the buckets
still have the layout of a rebuilt reducer, DDP is built with the rebuild's size limits
(``first_bucket_bytes_cap`` then ``bucket_bytes_cap``, reducer.cpp ``rebuild_buckets``) instead of the single
first-iteration bucket (``_BucketCapacityConfig.compute_bucket_size_limits``,
``find_unused_parameters=False``). The comm hook also files each bucket under MemTracker's Gradient category
(it is made in C++, outside any category).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

from .building import TraceError, quantization_notes, readable_failures
from .tracking import fsdp_tracker, memory_tracker, restart_peaks
from .training import optimizer, precision_dtypes, prepare
from .vision import add_vision


def _world(run: dict[str, Any]) -> int:
    dp = int(run.get("dp", 1))
    if run.get("fsdp") == "hybrid_shard":
        return max(1, min(dp, int(run.get("gpus_per_node", 8))))
    return dp


def _check(run: dict[str, Any]) -> str:
    zero, fsdp = int(run.get("zero", 0) or 0), run.get("fsdp", "none")
    if zero and run.get("zero_impl", "deepspeed") != "torch":
        raise TraceError("DeepSpeed ZeRO is not traced (ZeRO-1 is, as torch's: zero_impl 'torch')")
    if zero > 1:
        raise TraceError(f"ZeRO-{zero} is DeepSpeed's, which is not traced (ZeRO-1 is, as torch's)")
    if run.get("offload", "none") != "none":
        raise TraceError("CPU offload is not traced")
    if fsdp != "none":
        return "fsdp"
    return "zero1" if zero == 1 else "ddp"


def _own_units(model: Any, units: str) -> list[Any]:
    """The modules sharded apart before the root (``fsdp_units``; torchtune's custom_sharded_layers
    ['tok_embeddings', 'output'], training/_distributed.py shard_model): the input embedding and the output
    projection, none where the head's weight is the embedding's (tied: neither can be a unit alone)."""
    if units == "layers":
        return []
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and head.weight is emb.weight:
        return []
    return [emb] if units == "embedding" else [emb, head]


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers: the longest ModuleList of the model (wrapped by peft or not)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise TraceError("no decoder layer list found to shard")
    return list(max(lists, key=len))


@contextlib.contextmanager
def _fake_group(world: int, rank: int = 0) -> Any:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _post_forward_mesh_outside_fake() -> Any:
    """``reshard_after_forward=N`` builds its post-forward DeviceMesh from the real mesh tensor
    (``_fsdp_init._get_post_forward_mesh_info``), which the fake mode refuses; it is built outside it (the
    mesh holds rank numbers, no memory)."""
    import torch.distributed.fsdp._fully_shard._fully_shard as fs
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = fs._get_post_forward_mesh_info

    def outside(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return original(*args, **kwargs)

    fs._get_post_forward_mesh_info = outside
    try:
        yield
    finally:
        fs._get_post_forward_mesh_info = original


def _fsdp_build_run(run: dict[str, Any]) -> dict[str, Any]:
    """The run the model is built for: under mp-bf16 (``MixedPrecisionPolicy``) an fp32 model without
    autocast, the policy casting the gathered parameters to bf16."""
    return {**run, "precision": "fp32"} if run.get("precision") == "mp-bf16" else run


def _fsdp(model: Any, run: dict[str, Any], mesh: Any) -> tuple[Any, Any]:
    """FSDP2 as torchtune / accelerate apply it: ``fully_shard`` on every decoder layer, then on the root,
    each with the run's ``reshard_after_forward`` (True for full_shard, an int for ``reshard_size``, False
    for shard_grad_op) and, under mp-bf16, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if int(run.get("fsdp_version", 2)) != 2:
        raise TraceError("FSDP1 (FullyShardedDataParallel) is not traced; FSDP2 (fully_shard) is")
    reshard: bool | int = run.get("fsdp") != "shard_grad_op"
    if reshard and run.get("reshard_size"):
        reshard = int(run["reshard_size"])
    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard}
    if run.get("precision") == "mp-bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with _post_forward_mesh_outside_fake():
        for layer in _decoder_layers(model):
            fully_shard(layer, **kw)
        for module in _own_units(model, run.get("fsdp_units", "layers")):
            fully_shard(module, **kw)
        fully_shard(model, **kw)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params, run.get("optimizer", "adamw"))
    return fsdp_tracker(model, opt), opt


class Rerank(TraceError):
    """ZeroRedundancyOptimizer gives another rank more parameters than the traced one: trace that rank."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"rank {rank} holds the most parameters")
        self.rank = rank


@contextlib.contextmanager
def _rebuilt_bucket_layout() -> Any:
    """DDP's first buckets laid out as its one-time rebuild lays them out (see the module docstring); a torch
    without ``_BucketCapacityConfig`` keeps its first layout (the same bytes, in one bucket per dtype)."""
    import torch.nn.parallel.distributed as ddp_module

    cfg = getattr(ddp_module, "_BucketCapacityConfig", None)
    if cfg is None:
        yield
        return
    original = cfg.compute_bucket_size_limits

    def rebuilt(self: Any, static_graph: bool, find_unused_parameters: bool) -> tuple[list[int], list[int]]:
        return [self.first_bucket_bytes_cap, self.bucket_bytes_cap], []

    cfg.compute_bucket_size_limits = rebuilt
    try:
        yield
    finally:
        cfg.compute_bucket_size_limits = original


def _bucket_hook(mt: Any, bucket: Any) -> Any:
    """The debugging ``noop_hook`` (the fake group moves no data), filing the bucket as a gradient."""
    from torch.distributed._tools import mem_tracker
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    retag = getattr(mt, "_update_and_maybe_create_winfos", None)
    if retag is not None and hasattr(mem_tracker, "_MemRefType"):  # else: counted, under another category
        retag(bucket.buffer(), mem_tracker._MemRefType.GRAD)
    return noop_hook(None, bucket)


def _ddp(model: Any, run: dict[str, Any], zero1: bool, mt: Any, rank: int) -> tuple[Any, Any]:
    import torch
    import torch.nn.parallel.distributed as ddp_module
    from torch.nn.parallel import DistributedDataParallel

    class NoRebuild:  # the reducer, but for its one-time bucket rebuild (it reads index tensors)
        def __init__(self, reducer: Any) -> None:
            object.__setattr__(self, "_r", reducer)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._r, name)

        def _rebuild_buckets(self) -> bool:
            return False

    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    cap = float(run.get("bucket_cap_mb", 25.0))
    # torch's default (bucket_cap_mb=None) is 25 MB with a 1 MB first bucket; an explicit 25 has no small one
    kw = {} if cap == 25.0 else {"bucket_cap_mb": cap}
    with _rebuilt_bucket_layout():
        ddp = DistributedDataParallel(
            model, gradient_as_bucket_view=bool(run.get("bucket_view", False)), init_sync=False, **kw
        )
    # a lambda: DDP checks a hook's annotations, which postponed evaluation turns into strings
    ddp.register_comm_hook(mt, lambda state, bucket: _bucket_hook(state, bucket))
    ddp.reducer = NoRebuild(ddp.reducer)
    params = [p for p in ddp.parameters() if p.requires_grad]
    if not zero1:
        return ddp, optimizer(params, run.get("optimizer", "adamw"))
    if run.get("optimizer", "adamw") not in ("adamw", "adamw-foreach"):
        raise TraceError("ZeRO-1 is traced with AdamW (foreach) only")
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-5, foreach=True)
    held = [sum(p.numel() for g in r for p in g["params"]) for r in opt._partition_parameters()]
    worst = max(range(len(held)), key=lambda r: (held[r], -r))
    if worst != rank:
        raise Rerank(worst)
    return ddp, opt


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
    strategy, world = _check(run), _world(run)
    try:
        return _trace_as(raw, run, trust, strategy, world, 0)
    except Rerank as r:  # ZeRO-1: the rank with the largest share decides the fit
        return _trace_as(raw, run, trust, strategy, world, r.rank)


def _trace_as(
    raw: dict[str, Any], run: dict[str, Any], trust: bool, strategy: str, world: int, rank: int
) -> dict[str, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    notes: list[str] = [f"rank {rank} of {world} under torch's fake process group ({strategy})"]
    out: dict[str, Any] = {
        "notes": notes,
        "quantization": quantization_notes(raw, notes),
        "world_size": world,
        "rank": rank,
    }
    with _fake_group(world, rank), readable_failures():
        # the mesh is made from real tensors, outside the fake mode
        mesh = init_device_mesh("cpu", (world,)) if strategy == "fsdp" else None
        with FakeTensorMode():
            _trace_rank(raw, run, trust, strategy, mesh, out)
    gc.collect()
    return out


def _trace_rank(
    raw: dict[str, Any], run: dict[str, Any], trust: bool, strategy: str, mesh: Any, out: dict[str, Any]
) -> None:
    built = _fsdp_build_run(run) if strategy == "fsdp" else run
    cfg, model, ids = prepare(raw, built, trust, out)
    weights, autocast = precision_dtypes(built)
    if strategy == "fsdp":
        mt, opt = _fsdp(model, run, mesh)
        mt.track_inputs((ids,))
        with mt:
            _iterations(model, opt, mt, ids, autocast)
    else:
        mt = memory_tracker()
        mt.track_external(model, ids)
        with mt:  # entered before DDP is built, so the reducer's gradient buckets are seen
            module, opt = _ddp(model, run, strategy == "zero1", mt, out["rank"])
            _iterations(module, opt, mt, ids, autocast)
    out["phases"] = {k: v for k, v in mt.phase_peaks.items() if k != "warmup"}
    add_vision(out, cfg, weights, out["world_size"] if strategy == "fsdp" else 1)
