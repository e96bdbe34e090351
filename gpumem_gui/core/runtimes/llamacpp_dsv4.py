"""llama.cpp's cache for DeepSeek-V4 (``src/llama-kv-cache-dsv4.cpp`` at 035aa95, ggml-org/llama.cpp PR
#24162), at the byte: ``llama_kv_cache_dsv4`` owns four K-only caches and three compressor states, each
with one stream per sequence (``unified_raw`` / ``unified_compressed`` are false whatever ``--kv-unified``
says), each layer's part on the layer's device (host memory with ``--no-kv-offload``):

* the raw cache, a ``llama_kv_cache_iswa`` of every layer (all sliding: the non-SWA cache has 0 layers):
  ``min(n_ctx_seq, pad(n_swa + n_ubatch, 256))`` cells of ``head_dim`` K elements (``-ctk``), or
  ``n_ctx_seq`` with ``--swa-full``;
* the CSA cache (ratio-4 layers) and the lightning-indexer cache (the same layers, ``index_head_dim``
  wide): ``pad(ceil(n_ctx_seq / 4), 256)`` cells; the HCA cache (ratio-128 layers):
  ``pad(ceil(n_ctx_seq / 128), 256)`` cells (``dsv4_comp_size``, ``GGML_PAD(..., 256)``);
* ``llama_dsv4_comp_state`` per compressed layer: F32 ``kv`` and ``score`` tensors of ``state_size x
  n_embd_state`` per stream (CSA 8 x 2 head_dim, HCA 128 x head_dim, indexer 8 x 2 index_head_dim).

``n_ctx_seq`` is the per-slot context (``-c`` / ``-np``; gpumem's command passes ``-np`` = the batch).
"""

from __future__ import annotations

from math import ceil

from gpumem_gui.core.formats import kv_bytes_per_element
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

# llama-kv-cache-dsv4.cpp: DSV4_CSA_RATIO, DSV4_HCA_RATIO; the compressed caches' cells GGML_PAD(.., 256u)
CSA, HCA, CELL_PAD = 4, 128, 256
# llama-kv-cache-iswa.cpp: size_swa = min(size_base, GGML_PAD(n_swa x n_seq + n_ubatch, n_pad)) with one
# sequence per stream here; n_pad 256 (llama-context.cpp: the KV cells are padded to 256)
SWA_PAD = 256
# llama_dsv4_comp_state: two GGML_TYPE_F32 tensors (kv and score) per layer and stream
STATE_BYTES, STATE_TENSORS = 4, 2


def check(spec: ModelSpec) -> list[str]:
    """What is not measured for DeepSeek-V4 on llama.cpp (a warning)."""
    if model_kinds(spec).compressed is None:
        return []
    return [
        "llama.cpp: DeepSeek-V4's compute buffer (its compressor and indexer graph) is the generic "
        "estimate, not checked against llama.cpp's; its caches follow src/llama-kv-cache-dsv4.cpp"
    ]


def _pad(n: int, to: int) -> int:
    return ceil(n / to) * to


def caches(spec: ModelSpec, run: InferenceRun, k_type: str) -> dict[str, tuple[tuple[int, ...], int]]:
    """(layers, bytes per layer over every stream) of each buffer of ``llama_kv_cache_dsv4``."""
    at = model_kinds(spec).compressed
    assert at is not None
    n_seq, n_ctx_seq = run.batch, run.tokens
    types = at.layer_types
    csa = tuple(i for i, t in enumerate(types) if t == "compressed_sparse_attention")
    hca = tuple(i for i, t in enumerate(types) if t == "heavily_compressed_attention")
    elem = kv_bytes_per_element(k_type)
    d, di = at.head_dim, at.index_head_dim
    raw = n_ctx_seq if run.swa_full else min(n_ctx_seq, _pad(at.sliding_window + run.n_ubatch, SWA_PAD))
    c4, c128 = _pad(ceil(n_ctx_seq / CSA), CELL_PAD), _pad(ceil(n_ctx_seq / HCA), CELL_PAD)

    def k(cells: int, width: int) -> int:  # one layer's K rows over every stream (ggml_row_size)
        return round(n_seq * cells * width * elem)

    def state(rows: int, width: int) -> int:
        return n_seq * STATE_TENSORS * rows * width * STATE_BYTES

    return {
        "raw": (tuple(range(len(types))), k(raw, d)),
        "csa": (csa, k(c4, d)),
        "hca": (hca, k(c128, d)),
        "lid": (csa, k(c4, di)),
        "csa_state": (csa, state(2 * CSA, 2 * d)),
        "hca_state": (hca, state(HCA, d)),
        "lid_state": (csa, state(2 * CSA, 2 * di)),
    }


def kv_buffers(spec: ModelSpec, run: InferenceRun, offloaded: int, k_type: str) -> tuple[int, int]:
    """(GPU bytes, host bytes) of the cache: each layer's part where the layer runs (the last
    ``offloaded``), all in host memory with ``--no-kv-offload``."""
    first_gpu = spec.num_layers - offloaded
    gpu = host = 0
    for layers, size in caches(spec, run, k_type).values():
        on_gpu = sum(i >= first_gpu for i in layers) if run.kv_offload else 0
        gpu += on_gpu * size
        host += (len(layers) - on_gpu) * size
    return gpu, host
