"""Weight formats and KV-cache dtypes: what one model costs in bytes in each storage format.

:func:`weight_bytes` walks every parameter tensor of a :class:`~gpumem_gui.core.spec.model.ModelSpec`
(:func:`~gpumem_gui.core.spec.params.text_tensors`) and sizes it the way the runtime that produces or loads
the format stores it: the packed weights, and every scale, zero-point, index and lookup table that goes with
them. Tensors a format does not quantize (embeddings, norms, routers, lm_head, ...) stay at the compute dtype,
except in the plain float formats (everything at that width) and in GGUF (1-D tensors, routers and biases in
F32, as ``convert_hf_to_gguf.py`` writes them). The vision tower and projector of a multimodal spec are never
quantized: they stay at the compute dtype in every format except the plain float ones.

GGUF files are sized tensor by tensor: llama.cpp's ``llama-quantize`` picks a type per tensor
(``src/llama-quant.cpp``, ``llama_tensor_get_type_impl``), e.g. Q4_K_M keeps ``output.weight`` in Q6_K and
half of the ``attn_v``/``ffn_down`` tensors in Q6_K. :func:`gguf_plan` re-derives that choice from the
spec (our own implementation of the rules, reading the function at ggml-org/llama.cpp commit 007dbbf).

The KV-cache part (:data:`KV_DTYPES`, :func:`kv_bytes_per_element`, :func:`check_kv_dtype`) lists the
cache element types each engine accepts and their size per element, block scales included.

Modules: :mod:`.scheme` (the :class:`WeightFormat` record), :mod:`.registry` (every format by id),
:mod:`.hf_quant` (what the HF-side formats quantize and how), :mod:`.gguf_types` (ggml types and
llama.cpp file types), :mod:`.gguf_mix` (llama-quantize's per-tensor type choice), :mod:`.layout` (a
spec's tensors per kind of layer, HF and GGUF names), :mod:`.gguf_plan`, :mod:`.accounting`
(:func:`weight_bytes`) and :mod:`.kv` (KV-cache dtypes). This module re-exports their public names.
"""

from __future__ import annotations

from gpumem_gui.core.formats.accounting import WeightBytes, weight_bytes
from gpumem_gui.core.formats.accounting import _cached as _cached  # benchmarks/bench_core.py clears it
from gpumem_gui.core.formats.gguf_plan import GgufTensor, gguf_plan
from gpumem_gui.core.formats.kv import (
    ENGINES,
    KV_DTYPE_INFO,
    KV_DTYPES,
    KvDtype,
    check_kv_dtype,
    engine_kv_dtypes,
    kv_bytes_per_element,
)
from gpumem_gui.core.formats.registry import get_weight_format, list_weight_formats
from gpumem_gui.core.formats.scheme import Family, Parts, WeightFormat

__all__ = [
    "ENGINES",
    "KV_DTYPES",
    "KV_DTYPE_INFO",
    "Family",
    "GgufTensor",
    "KvDtype",
    "Parts",
    "WeightBytes",
    "WeightFormat",
    "check_kv_dtype",
    "engine_kv_dtypes",
    "get_weight_format",
    "gguf_plan",
    "kv_bytes_per_element",
    "list_weight_formats",
    "weight_bytes",
]
