"""KV-cache element types: the cache dtypes each engine accepts (:func:`engine_kv_dtypes`,
:func:`check_kv_dtype`) and the bytes one cached element takes in each, block scales included
(:data:`KV_DTYPES`, :func:`kv_bytes_per_element`)."""

from __future__ import annotations

import functools

from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.scheme import _SRC_FLOAT
from gpumem_gui.core.spec.model import Frozen

# the engines gpumem models (InferenceRun.engine)
ENGINES: tuple[str, ...] = ("transformers", "vllm", "llama.cpp", "sglang", "ollama")


class KvDtype(Frozen):
    """A KV-cache element type: bytes per element (block scales included) and the engines that take it."""

    id: str
    label: str
    bytes_per_element: float = Field(gt=0)
    engines: tuple[str, ...]
    source: str


# (block size, bytes per block) of the ggml types llama.cpp caches K/V in: ggml/src/ggml-common.h block_q8_0,
# block_q4_0, block_q4_1, block_iq4_nl, block_q5_0, block_q5_1 (= gguf-py GGML_QUANT_SIZES; written here so
# the core does not import gguf-py, ~0.1 s, to list KV dtypes: issue 18; tests/test_rough_ui.py checks them)
_GGML_KV_BLOCKS = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "IQ4_NL": (32, 18),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
}


def _ggml_kv(name: str) -> float:
    block, size = _GGML_KV_BLOCKS[name]
    return size / block


_SRC_LLAMACPP_KV = (
    "llama.cpp common/arg.cpp kv_cache_types (-ctk/-ctv: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
    "q5_1); bytes from ggml block sizes (gguf-py GGML_QUANT_SIZES)"
)
# OLLAMA_KV_CACHE_TYPE: f16 (default), q8_0, q4_0 (ollama fs/ggml/ggml.go SupportsKVCacheType)
_OLLAMA_KV = ("Q8_0", "Q4_0")
_SRC_VLLM_KV = (
    "vLLM vllm/config/cache.py CacheDType (auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2); auto = the model dtype"
)
_FP8_KV_ENGINES = ("vllm", "sglang")
_SRC_FP8_KV = (
    _SRC_VLLM_KV
    + "; SGLang python/sglang/srt/server_args.py --kv-cache-dtype (auto, fp8_e5m2, fp8_e4m3, bf16)"
)
_SRC_HF_KV = (
    "transformers cache_utils.py: DynamicCache stores K/V in the model dtype; QuantizedCache (quanto: 2/4 "
    "bits, HQQ: up to 8 bits) — element bytes only, its per-group scales/zero-points and the residual_length "
    "tokens kept in full precision are not included"
)

# Which engine may be told to cache in each dtype is that engine's own list of choices, nothing wider: vLLM's
# CacheDType has bfloat16 but no float16 / float32, SGLang's --kv-cache-dtype bf16 but no fp16 / fp32,
# Ollama's OLLAMA_KV_CACHE_TYPE f16, q8_0, q4_0 only (sources above). "auto" (the engine's default,
# check_kv_dtype) is not listed: a vLLM / SGLang server with --dtype float16 caches in fp16 that way, not by
# naming fp16.
_FLOAT_KV_ENGINES = {
    "fp32": ("transformers", "llama.cpp"),
    "fp16": ("transformers", "llama.cpp", "ollama"),
    "bf16": ("transformers", "llama.cpp", "vllm", "sglang"),
}
_SRC_FLOAT_KV = (
    f"{_SRC_FLOAT}; engines: {_SRC_LLAMACPP_KV}; {_SRC_FP8_KV}; Ollama fs/ggml/ggml.go SupportsKVCacheType"
)

_KV_LIST = (
    *(
        KvDtype(id=k, label=k, bytes_per_element=b, engines=_FLOAT_KV_ENGINES[k], source=_SRC_FLOAT_KV)
        for k, b in (("fp32", 4), ("fp16", 2), ("bf16", 2))
    ),
    KvDtype(id="fp8", label="fp8 (e4m3)", bytes_per_element=1, engines=("vllm",), source=_SRC_VLLM_KV),
    KvDtype(
        id="fp8_e4m3", label="fp8 e4m3", bytes_per_element=1, engines=_FP8_KV_ENGINES, source=_SRC_FP8_KV
    ),
    KvDtype(
        id="fp8_e5m2", label="fp8 e5m2", bytes_per_element=1, engines=_FP8_KV_ENGINES, source=_SRC_FP8_KV
    ),
    KvDtype(
        id="int8",
        label="int8 (quantized cache)",
        bytes_per_element=1,
        engines=("transformers",),
        source=_SRC_HF_KV,
    ),
    KvDtype(
        id="int4",
        label="int4 (quantized cache)",
        bytes_per_element=0.5,
        engines=("transformers",),
        source=_SRC_HF_KV,
    ),
    *(
        KvDtype(
            id=name.lower(),
            label=f"{name} (ggml block of {_GGML_KV_BLOCKS[name][0]})",
            bytes_per_element=_ggml_kv(name),
            engines=("llama.cpp", "ollama") if name in _OLLAMA_KV else ("llama.cpp",),
            source=_SRC_LLAMACPP_KV,
        )
        for name in ("Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1")
    ),
)

KV_DTYPE_INFO: dict[str, KvDtype] = {k.id: k for k in _KV_LIST}
KV_DTYPES: dict[str, float] = {k.id: k.bytes_per_element for k in _KV_LIST}
"""Bytes per cached element of each KV dtype id (``q8_0``: 34/32, a 32-element block with an fp16 scale)."""

# Spellings engines use on their command lines (llama.cpp f16/f32, vLLM bfloat16/float16).
_KV_ALIASES = {
    "f32": "fp32",
    "f16": "fp16",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "half": "fp16",
}


def _kv_id(kv_dtype: str) -> str:
    key = kv_dtype.strip().lower() if isinstance(kv_dtype, str) else ""
    return _KV_ALIASES.get(key, key)


@functools.cache
def engine_kv_dtypes(engine: str) -> tuple[str, ...]:
    """KV dtype ids ``engine`` accepts (vLLM's ``auto`` is resolved to the compute dtype before sizing);
    fixed per engine, so computed once (every estimate checks its KV dtype against them)."""
    if engine not in ENGINES:
        raise GpumemInputError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}", field="engine")
    return tuple(k.id for k in _KV_LIST if engine in k.engines)


def kv_bytes_per_element(kv_dtype: str) -> float:
    """Bytes one cached K or V element takes in ``kv_dtype`` (block scales included)."""
    kid = _kv_id(kv_dtype)
    if kid in KV_DTYPES:
        return KV_DTYPES[kid]
    if kid == "auto":
        raise GpumemInputError(
            "'auto' means the compute dtype: resolve it before sizing the cache", field="kv_dtype"
        )
    raise GpumemInputError(
        f"unknown KV-cache dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}", field="kv_dtype"
    )


def check_kv_dtype(engine: str, kv_dtype: str) -> None:
    """Raise :class:`GpumemInputError` (field ``kv_dtype``) unless ``engine`` can be told to cache in
    ``kv_dtype``: one of its own choices, or ``auto`` (its default, which every engine has)."""
    allowed = engine_kv_dtypes(engine)
    kid = _kv_id(kv_dtype)
    if kid in allowed or kid == "auto":
        return
    raise GpumemInputError(
        f"{engine} cannot store the KV cache as {kv_dtype!r}; allowed: auto, {', '.join(allowed)}",
        field="kv_dtype",
    )
