"""What a training rank holds beside torch's tensors: its CUDA context, its cuBLAS workspaces and the NCCL
communicators of the parallel layout (sized by :mod:`gpumem_gui.core.results.nontorch`).

Communicators, one per process group a rank runs collectives or point-to-point operations on (PyTorch
creates one NCCL communicator per process group and device, ProcessGroupNCCL ``getNCCLComm``):

* data parallel: DDP's reducer over the ``dp`` ranks; FSDP and ZeRO over ``dp x cp``
  (:func:`~gpumem_gui.core.training.model_parallel.shard_run`); HYBRID_SHARD a shard group of a node's ranks
  plus a replicate group across nodes (torch ``init_device_mesh`` makes one group per mesh dimension);
* tensor parallel: the ``tp`` ranks (all-reduce / all-gather / reduce-scatter);
* context parallel: the ``cp`` ranks (torchtitan's default ``context_parallel_rotate_method`` "allgather");
* pipeline parallel: point to point with the previous and the next stage (torch.distributed.pipelining
  ``batch_isend_irecv``);
* expert parallel: all-to-all, point to point with the other ``ep - 1`` ranks.

A group of one rank connects nothing. Not modelled: the default (world) group, which PyTorch connects only
when a collective runs on it; NCCL's tree, NVLS and CollNet buffers (with NCCL_RUNTIME_CONNECT, default 1 in
src/init.cc, NCCL connects an algorithm when a collective first uses it; the model counts rings, which the
large gradient and parameter collectives use).
"""

from __future__ import annotations

from gpumem_gui.core.results.nontorch import CommGroup, NonTorch
from gpumem_gui.core.training.frameworks import framework
from gpumem_gui.core.training.frameworks.fsdp import shard_world
from gpumem_gui.core.training.model_parallel import shard_run
from gpumem_gui.core.training.run import TrainingRun

# cuBLAS handles per training process: forward runs on the main thread, backward (recomputation included) on
# the autograd engine's worker thread of the device (torch/csrc/autograd/engine.cpp, one thread per device),
# and getCurrentCUDABlasHandle reserves one handle per thread (CublasHandlePool.cpp: a thread_local
# PoolWindow); both use the current (default) stream, so each holds one workspace. FSDP's all-gather /
# reduce-scatter streams and DDP's NCCL streams run copies and NCCL kernels, no cuBLAS call.
TRAINING_WORKSPACES = 2


def _data_groups(run: TrainingRun) -> list[CommGroup]:
    if framework(shard_run(run)).name == "ddp":
        return [CommGroup(name="dp", ranks=run.dp)] if run.dp > 1 else []
    sr = shard_run(run)
    shard = shard_world(sr)
    groups = [CommGroup(name="dp_shard", ranks=shard)] if shard > 1 else []
    if sr.dp // shard > 1:  # HYBRID_SHARD: the all-reduce across nodes
        groups.append(CommGroup(name="dp_replicate", ranks=sr.dp // shard))
    return groups


def process_groups(run: TrainingRun, stage: int) -> tuple[CommGroup, ...]:
    """The NCCL communicators a rank of pipeline stage ``stage`` belongs to (see the module docstring)."""
    groups = _data_groups(run)
    if run.tp > 1:
        groups.append(CommGroup(name="tp", ranks=run.tp))
    if run.cp > 1:
        groups.append(CommGroup(name="cp", ranks=run.cp))
    if run.pp > 1:
        groups.append(CommGroup(name="pp", ranks=run.pp, peers=(stage > 0) + (stage < run.pp - 1)))
    if run.ep > 1:
        groups.append(CommGroup(name="ep", ranks=run.ep, peers=run.ep - 1))
    return tuple(groups)


def rank_nontorch(run: TrainingRun, stage: int) -> NonTorch:
    """What one rank of stage ``stage`` holds beside torch's tensors."""
    return NonTorch(
        gpu_arch=run.gpu_arch,
        context_mib=run.cuda_context_mib,
        workspaces=TRAINING_WORKSPACES,
        workspace_note="forward on the main thread, backward on the autograd device thread",
        groups=process_groups(run, stage),
        nccl_channels=run.nccl_channels,
    )
