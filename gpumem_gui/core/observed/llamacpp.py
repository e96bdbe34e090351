"""llama.cpp's buffer lines (Ollama's runner prints the same), one record per GPU device and load.

Sources: llama.cpp ``src/llama-model.cpp`` / ``llama.cpp`` ("load_tensors: CUDA0 model buffer size =
W MiB"), ``llama-kv-cache.cpp`` ("llama_kv_cache_init: CUDA0 KV buffer size = K MiB"; older builds "KV self
size = K MiB" without the device), ``llama-context.cpp`` ("CUDA0 compute buffer size = C MiB"): each
``ggml_backend_buffer_get_size(buf) / 1024.0 / 1024.0`` printed "%.2f MiB" (2^20 bytes). The allocation
failures: ``ggml/src/ggml-alloc.c`` ("failed to allocate CUDA0 buffer of size N", N in bytes, ``%zu``) and
``ggml-cuda.cu`` ``ggml_backend_cuda_buffer_type_alloc_buffer`` ("allocating R MiB on device d: cudaMalloc
failed: out of memory"). The device's number (CUDA0, ROCm1, Vulkan0) is the GPU index; host buffers (CPU,
CUDA_Host, CPU_Mapped) are not a GPU's and are not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import Draft
from gpumem_gui.core.observed.engine_log import read_log

_DEVICE = r"(?:CUDA|ROCm|Vulkan|SYCL|MUSA)(\d{1,4})"
_N = r"(\d+(?:\.\d+)?)"
_LINES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("weights", re.compile(rf"\b{_DEVICE} model buffer size\s*=\s*{_N} MiB"), "weights"),
    ("kv", re.compile(rf"\b{_DEVICE} KV buffer size\s*=\s*{_N} MiB"), "kv_cache"),
    ("compute", re.compile(rf"\b{_DEVICE} compute buffer size\s*=\s*{_N} MiB"), "compute_buffer"),
)
_KV_SELF = re.compile(rf"KV self size\s*=\s*{_N} MiB")
_FAILED = re.compile(rf"failed to allocate {_DEVICE} buffer of size (\d+)")
_CUDA_MALLOC = re.compile(rf"allocating {_N} MiB on device (\d{{1,4}}): cudaMalloc failed")
_MARKERS = (" MiB", "failed to allocate")


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every GPU device's llama.cpp buffer lines in ``text``: (offset of its first line, record)."""
    return read_log(text, "llamacpp", _read_line, _MARKERS, _device_of)


def _device_of(line: str) -> str:
    m = re.search(rf"\b{_DEVICE}\b|on device (\d{{1,4}})", line)
    return (m.group(1) or m.group(2)) if m else ""


def _read_line(d: Draft, line: str) -> list[str]:
    for kind, pattern, part in _LINES:
        if (m := pattern.search(line)) is not None:
            d.gpu_index = int(m.group(1))
            d.part(part, m.group(2), "MiB", f"llama.cpp {part}")
            return [kind]
    if (m := _KV_SELF.search(line)) is not None:
        d.part("kv_cache", m.group(1), "MiB", "llama.cpp KV self size")
        d.unread.append("KV self size: the KV cache of every device together; the log names no GPU")
        return ["kv"]
    if (m := _FAILED.search(line)) is not None:
        d.gpu_index = int(m.group(1))
        d.size("requested_bytes", m.group(2), "bytes", "llama.cpp failed allocation")
        return ["failed"]
    if (m := _CUDA_MALLOC.search(line)) is not None:
        d.gpu_index = int(m.group(2))
        d.size("requested_bytes", m.group(1), "MiB", "llama.cpp cudaMalloc")
        return ["malloc_failed"]
    return []
