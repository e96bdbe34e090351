"""SGLang's defaults that depend on the GPU: ``chunked_prefill_size``, ``cuda_graph_max_bs``, the CUDA-graph
batch sizes and ``mem_fraction_static``, resolved the way ``python/sglang/srt/server_args.py``
``_handle_gpu_memory_settings`` and ``_generate_cuda_graph_batch_sizes`` do (SGLang 0.5.x, PR #10975).

SGLang reads the GPU's memory in MiB as ``nvidia-smi`` reports it (``get_device_memory_capacity``): our
GPU capacity in bytes / 2**20. Without a GPU (capacity unknown) SGLang falls back to chunked prefill 4096,
cuda_graph_max_bs 160 and mem_fraction_static 0.88.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.runtimes.run import InferenceRun

_SRC = "python/sglang/srt/server_args.py _handle_gpu_memory_settings"

# (GPU memory below, MiB) -> (chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4); the last row
# is every larger GPU (B200, MI300). The buckets and values are SGLang's (server_args.py, see _SRC).
_BUCKETS: tuple[tuple[float, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),  # T4, RTX 4080
    (35 * 1024, 2048, 24, 80),  # A10, RTX 4090, RTX 5090
    (60 * 1024, 4096, 32, 160),  # A100 40GB, L40
    (90 * 1024, 8192, 256, 512),  # H100, A100 80GB
    (160 * 1024, 8192, 256, 512),  # H20, H200
    (float("inf"), 16384, 512, 512),  # B200, MI300
)
_NO_GPU = (4096, 160, 0.88)  # SGLang's fallbacks when the GPU's memory is unknown


@dataclass(frozen=True)
class ServerDefaults:
    """The GPU-dependent settings an SGLang server runs with (the run's own values where it sets them)."""

    mem_fraction_static: float
    fraction_is_default: bool
    reserved_mib: float | None  # SGLang's reserve estimate behind its default fraction (None: not used)
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    capture_sizes: tuple[int, ...]  # decode batch sizes captured as CUDA graphs (empty: none)
    vlm_factor: float = 1.0  # a multimodal model's factor on the default fraction (runtimes/sglang_mm.py)

    def explain(self) -> str:
        if not self.fraction_is_default:
            return f"mem_fraction_static {self.mem_fraction_static:g} (set by the run)"
        vlm = (
            f" x {self.vlm_factor:.4g} for the vision tower (adjust_mem_fraction_for_vlm)"
            if self.vlm_factor != 1.0
            else ""
        )
        if self.reserved_mib is None:
            return f"mem_fraction_static {self.mem_fraction_static:g} (SGLang's fallback without a GPU{vlm})"
        return (
            f"mem_fraction_static {self.mem_fraction_static:g} = round((gpu_mem - reserved) / gpu_mem, 3)"
            f"{vlm}, reserved = {self.reserved_mib:,.0f} MiB (SGLang's default, {_SRC})"
        )


def capture_sizes(max_bs: int, disabled: bool) -> tuple[int, ...]:
    """Decode batch sizes SGLang captures (``_generate_cuda_graph_batch_sizes``, no speculative decoding):
    1, 2, 4, 8, 12, then every 8 to 256, every 16 to 512, every 32 beyond, up to ``max_bs``."""
    if disabled:
        return ()
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(b for b in sizes if b <= max_bs)


def _reserved_mib(run: InferenceRun, gpu_mib: float, chunk: int, max_bs: int) -> float:
    """SGLang's estimate (MiB) of the memory outside the static fraction: attention metadata, the
    activations of a chunked-prefill forward, CUDA graphs, parallel overheads (server_args.py, see _SRC)."""
    reserved = 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + run.tp * run.pp / 8 * 1024
    if run.enable_dp_attention:
        reserved += max_bs * run.dp_size * 3
        if max_bs > 300:
            reserved += max_bs * run.dp_size * 1.5
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def server_defaults(run: InferenceRun, capacity: int | None, vlm_factor: float = 1.0) -> ServerDefaults:
    """The settings SGLang runs ``run`` with on a GPU of ``capacity`` bytes (None: unknown); a multimodal
    model's default fraction times ``vlm_factor`` (runtimes/sglang_mm.py)."""
    if capacity:
        gpu_mib = capacity / 2**20
        _, chunk_d, bs_small, bs_large = next(b for b in _BUCKETS if gpu_mib < b[0])
        bs_d = bs_small if run.tp < 4 else bs_large
    else:
        gpu_mib, (chunk_d, bs_d, _) = 0.0, _NO_GPU
    chunk = run.chunked_prefill_size or chunk_d
    max_bs = run.cuda_graph_max_bs or bs_d
    sizes = capture_sizes(max_bs, run.disable_cuda_graph)
    if run.mem_fraction_static is not None:
        return ServerDefaults(run.mem_fraction_static, False, None, chunk, max_bs, sizes)
    if not capacity:
        return ServerDefaults(_NO_GPU[2] * vlm_factor, True, None, chunk, max_bs, sizes, vlm_factor)
    reserved = _reserved_mib(run, gpu_mib, chunk, max_bs)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    return ServerDefaults(fraction * vlm_factor, True, reserved, chunk, max_bs, sizes, vlm_factor)
