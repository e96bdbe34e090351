"""Non-torch memory of one GPU process, as a model: the CUDA context by GPU generation, the cuBLAS workspaces
by the threads and streams that run matmuls, NCCL's buffers by the communicators of the parallel layout.

An estimate is made without a GPU, so the generation is a run field (``gpu_arch``): ``auto`` is the fit
target's generation when the CLI or a fit names a catalog GPU (``core/fit/targets.py``), else
:data:`DEFAULT_ARCH`. ``cuda_context_mib`` (when set) overrides the context alone.
"""

from __future__ import annotations

from pydantic import Field

from gpumem_gui.core.fields import DEFAULT_NCCL_CHANNELS, GpuArch
from gpumem_gui.core.results.estimate import Component, Explanation
from gpumem_gui.core.spec.model import Frozen
from gpumem_gui.core.units import KiB, MiB

# the generation an estimate assumes when no target GPU names one: the H100 / H200 the published training
# runs of the validation report mostly ran on (a stated choice, not a measurement)
DEFAULT_ARCH: GpuArch = "hopper"

# ---- CUDA context ------------------------------------------------------------------------------------------
# What one process holds on a GPU once the CUDA context exists, before any tensor: driver structures, the
# local memory reserved for resident threads and the kernels loaded so far. PyTorch >= 1.13 sets
# CUDA_MODULE_LOADING=LAZY (pytorch/pytorch#86509: 287,047,680 B used after one tensor, against 666,632,192 B
# with eager loading), so kernels load on first use (CUDA >= 11.7 supports it). A run that calls many kernels
# loads more than these idle figures (not modelled: no published per-generation figure after a training step);
# --cuda-context-mib overrides. Published idle-process figures, one per generation where one exists:
CONTEXT_MIB: dict[GpuArch, tuple[int, str]] = {
    # InvokeAI issue #9413 (2x RTX 3090, torch 2.7.1+cu128, driver 610.43): "a flat 256 MiB" per idle process
    "ampere": (256, "RTX 3090 idle process, torch 2.7.1+cu128: 256 MiB (invoke-ai/InvokeAI#9413)"),
    # unsloth-zoo PR #1053 (RTX 6000 Ada, torch 2.10.0+cu130): after torch.cuda.mem_get_info(0), nvidia-smi
    # shows 426 MiB for the process
    "ada": (426, "RTX 6000 Ada, torch 2.10+cu130, after mem_get_info: 426 MiB (unslothai/unsloth-zoo#1053)"),
    # SGLang on H100 TP1 before the weights load: "Load weight begin. avail mem=78.81 GB" of a 79.19 GiB CUDA
    # total (docs.sglang.ai openai_api_completions, docs build of 2025-01-23; validation/data/engine_logs/
    # sglang.json 'preload'): 0.38 GiB = 389 MiB, the smallest of the three published H100 readings
    "hopper": (389, "H100 SGLang TP1 before weights: 79.19 - 78.81 GiB = 389 MiB (docs.sglang.ai, 2025-01)"),
    # the Hopper figure plus what a B200 holds beyond an H100 under the same SGLang generation before weights:
    # 0.79 GiB (B200, clean-startup-log reference 2026-04) - 0.76 GiB (H100, docs.sglang.io lora 2026-02) =
    # 0.03 GiB = 31 MiB
    "blackwell": (420, "Hopper's 389 MiB + 31 MiB: B200 0.79 GiB vs H100 0.76 GiB SGLang preload (2026)"),
    # no published lazy-loading figure for these: NVIDIA's statement for CUDA >= 11.7 with lazy loading,
    # "around 400MB" (ptrblck, pytorch/pytorch#109888), read as 400 MiB
    "volta": (400, "no per-GPU figure found: ~400 MB with lazy loading (ptrblck, pytorch/pytorch#109888)"),
    "turing": (400, "no per-GPU figure found: ~400 MB with lazy loading (ptrblck, pytorch/pytorch#109888)"),
}


def resolve_arch(gpu_arch: str) -> GpuArch:
    """The generation a run field names; ``auto`` (no target GPU known) is :data:`DEFAULT_ARCH`."""
    return DEFAULT_ARCH if gpu_arch == "auto" else gpu_arch  # type: ignore[return-value]


def arch_of(compute_capability: str) -> GpuArch | None:
    """The generation of an NVIDIA compute capability (``'9.0'`` -> ``hopper``); None before Volta."""
    major, minor = (int(x) for x in compute_capability.split("."))
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    return "blackwell" if major >= 10 else None  # 10.x data centre, 12.x GeForce / RTX PRO Blackwell


def context_bytes(gpu_arch: str, override_mib: int | None) -> int:
    """The CUDA context of one process: the override when given, else the generation's published figure."""
    if override_mib is not None:
        return override_mib * MiB
    return CONTEXT_MIB[resolve_arch(gpu_arch)][0] * MiB


# ---- cuBLAS workspaces -------------------------------------------------------------------------------------
# PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize (2.13 era): CUBLAS_WORKSPACE_CONFIG
# defaults to ":4096:2:16:8" (2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B; pytorch/pytorch#95668 measured exactly
# 8519680 bytes left allocated after one nn.Linear on an A10G) and to ":4096:8" = 32 MiB when the device's
# major compute capability is 9, 10, 11 or 12 (Hopper and Blackwell; pytorch/pytorch#175344 re-enabled
# Blackwell). setWorkspaceForHandle allocates one workspace per (handle, stream) from the caching allocator;
# cuBLASLt shares it (getCUDABlasLtWorkspaceSize caps CUBLASLT_WORKSPACE_SIZE, default 1024 KiB, at the cuBLAS
# size while TORCH_CUBLASLT_UNIFIED_WORKSPACE is unset, and getCUDABlasLtWorkspace takes the cuBLAS map's
# entry).
CUBLAS_WORKSPACE_SMALL = 2 * 4096 * KiB + 8 * 16 * KiB
CUBLAS_WORKSPACE_LARGE = 8 * 4096 * KiB
_LARGE_WORKSPACE_ARCHS = ("hopper", "blackwell")


def cublas_workspace_bytes(gpu_arch: str) -> int:
    """One cuBLAS (and cuBLASLt) workspace on this generation."""
    large = resolve_arch(gpu_arch) in _LARGE_WORKSPACE_ARCHS
    return CUBLAS_WORKSPACE_LARGE if large else CUBLAS_WORKSPACE_SMALL


# ---- NCCL buffers ------------------------------------------------------------------------------------------
# NCCL src/init.cc computeBuffSizes defaults, one per protocol and connection: LL = NCCL_LL_LINES_PER_THREAD
# (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS (8) x sizeof(ncclLLFifoLine) (16); LL128 =
# NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS (8) x 8; Simple =
# DEFAULT_BUFFSIZE 4 MiB (NCCL_BUFFSIZE).
NCCL_LL_BYTES = 8 * 512 * 8 * 16
NCCL_LL128_BYTES = 120 * 640 * 8 * 8
NCCL_SIMPLE_BYTES = 4 * MiB
# src/transport/p2p.cc p2pRecvSetup / p2pSendSetup: the receiving end holds ncclRecvMem + the three buffers,
# the sending end ncclSendMem (a few KiB each, inside the rounding), each rounded up by ALIGN_SIZE to
# CUDA_IPC_MIN (2 MiB): 10 MiB + 2 MiB per connection (with P2P read, NVLink on Ampere and later, the Simple
# buffer moves to the sending end: 6 + 6 MiB, the same 12 MiB). NVIDIA/nccl#1685 logged exactly these two
# allocation sizes, 10485760 and 2097152, per channel and peer on 8 x H100.
CUDA_IPC_MIN = 2 * MiB


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def connection_bytes() -> int:
    """What one GPU holds for one channel of a ring (its receive end from the previous rank and its send end
    to the next) or of one point-to-point peer (a send and a receive connection)."""
    return _align(NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES, CUDA_IPC_MIN) + CUDA_IPC_MIN


def p2p_channels_per_peer(channels: int) -> int:
    """src/graph/paths.cc ncclTopoComputeP2pChannels rounds the channel count up to a power of two
    (nextPow2); on NVLink every peer gets all of them (32 with 24 coll channels, the H100 log above)."""
    return 1 << (channels - 1).bit_length()


class CommGroup(Frozen):
    """One NCCL communicator a rank belongs to: ``ranks`` in it; ``peers`` > 0 when the rank only exchanges
    point to point with that many of them (pipeline send / recv, expert all-to-all); 0: ring collectives."""

    name: str = Field(min_length=1)
    ranks: int = Field(ge=2)
    peers: int = Field(0, ge=0)


def nccl_bytes(groups: tuple[CommGroup, ...], channels: int) -> int:
    """NCCL's buffers on one GPU for ``groups``: ring communicators connect every channel to one previous and
    one next rank; point-to-point ones connect each peer on :func:`p2p_channels_per_peer` channels."""
    per = connection_bytes()
    return sum((g.peers * p2p_channels_per_peer(channels) if g.peers else channels) * per for g in groups)


class NonTorch(Frozen):
    """What one process holds beside torch's tensors: its GPU generation (a ``gpu_arch`` run value), the
    context override, the cuBLAS workspaces (one per thread and stream that runs matmuls) and the NCCL
    communicators of its rank."""

    gpu_arch: str = "auto"
    context_mib: int | None = Field(None, ge=0)
    workspaces: int = Field(1, ge=0)
    groups: tuple[CommGroup, ...] = ()
    nccl_channels: int = Field(DEFAULT_NCCL_CHANNELS, ge=1)
    workspace_note: str = "the main thread's handle on the default stream"


def nontorch_components(nt: NonTorch) -> tuple[Component, ...]:
    """The CUDA context, the cuBLAS workspaces and (with communicators) the NCCL buffers of one process."""
    arch = resolve_arch(nt.gpu_arch)
    ctx = context_bytes(arch, nt.context_mib)
    ws = cublas_workspace_bytes(arch)
    ctx_source = "--cuda-context-mib" if nt.context_mib is not None else CONTEXT_MIB[arch][1]
    out = [
        Component(
            key="cuda_context",
            label="CUDA context",
            bytes=ctx,
            explain=Explanation(
                formula="per process and GPU: driver context and the kernels loaded so far (lazy loading)",
                inputs={"gpu_arch": arch, "context_bytes": ctx},
                source=ctx_source,
            ),
        ),
        Component(
            key="workspace",
            label="cuBLAS workspace",
            bytes=nt.workspaces * ws,
            explain=Explanation(
                formula=f"workspaces x size by generation ({nt.workspace_note})",
                inputs={"gpu_arch": arch, "workspaces": nt.workspaces, "workspace_bytes": ws},
                source="PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize, "
                "setWorkspaceForHandle (one per handle and stream; cuBLASLt unified)",
            ),
        ),
    ]
    if nt.groups:
        out.append(_nccl_component(nt.groups, nt.nccl_channels))
    return tuple(out)


def _nccl_component(groups: tuple[CommGroup, ...], channels: int) -> Component:
    inputs: dict[str, int | float | str | bool | None] = {
        "nccl_channels": channels,
        "p2p_channels_per_peer": p2p_channels_per_peer(channels),
        "bytes_per_channel_and_peer": connection_bytes(),
    }
    for g in groups:
        inputs[f"{g.name}_ranks"] = g.ranks
        if g.peers:
            inputs[f"{g.name}_peers"] = g.peers
    return Component(
        key="nccl_buffers",
        label="NCCL buffers",
        bytes=nccl_bytes(groups, channels),
        explain=Explanation(
            formula="per communicator: ring: channels x per-channel bytes; point-to-point: peers x p2p "
            "channels per peer x per-channel bytes; per-channel bytes = (LL + LL128 + Simple rounded up to "
            "2 MiB) + 2 MiB send side (ring only: no tree, NVLS or CollNet buffers)",
            inputs=inputs,
            source="NCCL src/init.cc computeBuffSizes, src/transport/p2p.cc p2pRecvSetup (ALIGN_SIZE "
            "CUDA_IPC_MIN), src/graph/paths.cc ncclTopoComputeP2pChannels; 10 MiB + 2 MiB allocations per "
            "channel and peer in NVIDIA/nccl#1685; 24 coll channels on 8 x H100",
        ),
    )


# what a process holds outside PyTorch's caching allocator: torch.cuda.max_memory_reserved leaves these out,
# nvidia-smi counts them (the cuBLAS workspaces come from the caching allocator: setWorkspaceForHandle)
OUTSIDE_ALLOCATOR = ("cuda_context", "nccl_buffers")


def outside_allocator_bytes(components: tuple[Component, ...]) -> int:
    """The bytes of ``components`` (an estimate's) that torch's reserved memory does not count."""
    return sum(c.bytes for c in components if c.key in OUTSIDE_ALLOCATOR)
