"""vLLM's own knobs beyond the shared inference fields, declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.runtimes.run.InferenceRun` with ``engines=("vllm",)``.

Each default is vLLM's own (V1 engine; ``vllm_engine`` v0 swaps in the V0 engine's), with its source; the
semantics live in :mod:`.vllm` and
:mod:`.vllm_profile`. Prefix caching (``--enable-prefix-caching``) has no field: it reuses pages of the same
pool and allocates nothing of its own, so it changes no byte of the estimate.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI

_G = "vLLM"
_E = ("vllm",)

VllmMaxNumSeqs = Annotated[
    int | None,
    Field(ge=1, le=1 << 16),
    UI(
        "Max sequences",
        _G,
        "concurrent sequences (--max-num-seqs); sizes the sampler's buffers in the profiling run. Auto: "
        "vLLM's default for the GPU, 1024 on GPUs of 70 GiB or more, else 256 (vllm/engine/arg_utils.py)",
        special="auto (by GPU)",
        none=0,
        engines=_E,
    ),
]

VllmMaxCaptureSize = Annotated[
    int | None,
    Field(ge=1, le=1 << 16),
    UI(
        "Max CUDA-graph size",
        _G,
        "--max-cudagraph-capture-size: the largest batch captured as a CUDA graph; the capture sizes are "
        "1, 2, 4, then every 8 up to 256 and every 16 above (vllm/config/compilation.py). Auto: "
        "min(2 x max_num_seqs, 512)",
        unit=" seqs",
        step=16,
        special="auto",
        none=0,
        engines=_E,
    ),
]

VllmEnforceEager = Annotated[
    bool,
    UI("Enforce eager", _G, "no CUDA-graph capture (saves its memory pool, runs slower)", engines=_E),
]

VllmProfileCudagraphs = Annotated[
    bool,
    UI(
        "CUDA graphs in the budget",
        _G,
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: the CUDA-graph pool is taken out of the "
        "gpu_memory_utilization budget before the KV cache (default since vLLM v0.21); off: the pool "
        "comes on top of the budget (vLLM v0.10 to v0.20)",
        engines=_E,
    ),
]

VllmTpLink = Annotated[
    Literal["auto", "nvlink", "pcie"],
    UI(
        "TP interconnect",
        _G,
        "how the tensor-parallel GPUs are linked: NVLink/NVSwitch (NCCL P2P and NVLS buffers, custom "
        "all-reduce) or PCIe (no custom all-reduce, NCCL through host memory); auto: NVLink when each GPU "
        "has 70 GiB or more (the SXM/NVSwitch parts), else PCIe",
        choices=(("auto (by GPU size)", "auto"), ("NVLink / NVSwitch", "nvlink"), ("PCIe", "pcie")),
        engines=_E,
    ),
]

VllmBlockSize = Annotated[
    int,
    Field(ge=1, le=4096),
    UI(
        "KV block size",
        _G,
        "--block-size: tokens per KV page (16 for most attention backends; MLA backends use 64)",
        unit=" tokens",
        engines=_E,
    ),
]

VllmHybridKvCache = Annotated[
    bool,
    UI(
        "Hybrid KV allocator",
        _G,
        "vLLM's hybrid KV-cache manager for models mixing sliding-window or chunked-local (Llama 4) and "
        "full-attention layers: a sliding layer keeps only its window's pages, a chunked one its chunk's "
        "(vllm/v1/core/kv_cache_utils.py). Off (--disable-hybrid-kv-cache-manager; vLLM also turns it off "
        "with a KV connector, and for chunked models when VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE "
        "is 0, its default up to v0.12): every layer is sized for the whole context",
        engines=_E,
    ),
]

VllmImagesPerPrompt = Annotated[
    int | None,
    Field(ge=0, le=1 << 16),
    UI(
        "Images per prompt",
        _G,
        "--limit-mm-per-prompt image=N, for models with a vision tower: caps the images the profiling run "
        "feeds the encoder (vllm/multimodal/encoder_budget.py); 0: text only, no encoder profiling. Auto: "
        "vLLM's default limit (999 per modality)",
        special="auto (999)",
        none=-1,
        engines=_E,
    ),
]

VllmEngine = Annotated[
    Literal["v1", "v0"],
    UI(
        "Engine generation",
        _G,
        "v1: vLLM's V1 engine (the default since v0.8); v0: the V0 engine of older logs (VLLM_USE_V1=0 up "
        "to v0.10): max_num_seqs 256, max_num_batched_tokens max(max_model_len, 2048) (2048 above 32K "
        "tokens, chunked prefill), CUDA graphs of up to 256 sequences captured after the KV cache, outside "
        "the budget",
        choices=(("V1 (v0.8 and later)", "v1"), ("V0 (up to v0.7; VLLM_USE_V1=0)", "v0")),
        engines=_E,
    ),
]
