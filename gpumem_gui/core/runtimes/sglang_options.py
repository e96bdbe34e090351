"""SGLang's run fields, declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.runtimes.run.InferenceRun`; their semantics live in :mod:`.sglang`.

Each optional field's None is SGLang's own default, which depends on the GPU's memory and the TP degree
(``python/sglang/srt/server_args.py`` ``_handle_gpu_memory_settings``): the estimate resolves it and lists
the value it used. The context length reuses ``max_model_len`` (SGLang's ``--context-length``), the KV
dtype ``kv_dtype`` (``--kv-cache-dtype``), the weight format ``weights`` (``--quantization``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI

_S = "SGLang"
_ONLY = ("sglang",)

MemFractionStatic = Annotated[
    float | None,
    Field(ge=0.01, le=1),
    UI(
        "Static memory fraction",
        _S,
        "mem_fraction_static: the share of the GPU's free memory at start that weights and the KV pool may "
        "take; the rest is the reserve for activations, CUDA graphs and the request pool (auto: SGLang's "
        "default for the GPU's memory and tp)",
        step=0.01,
        decimals=3,
        special="auto (by GPU memory)",
        none=0,
        engines=_ONLY,
    ),
]
ChunkedPrefillSize = Annotated[
    int | None,
    Field(ge=1, le=1 << 24),
    UI(
        "Chunked prefill size",
        _S,
        "tokens of one prefill chunk: sizes the activations of a prefill forward (auto: 2048 below 35 GiB "
        "GPUs, 4096 below 60, 8192 below 160, 16384 above)",
        unit=" tokens",
        step=1024,
        special="auto (by GPU memory)",
        none=0,
        engines=_ONLY,
    ),
]
MaxRunningRequests = Annotated[
    int | None,
    Field(ge=1, le=1 << 20),
    UI(
        "Max running requests",
        _S,
        "requests decoded at once; sizes the request-to-token pool (auto: from the KV pool and the context "
        "length, 2048 to 4096, at most half the pool's tokens)",
        special="auto",
        none=0,
        engines=_ONLY,
    ),
]
CudaGraphMaxBs = Annotated[
    int | None,
    Field(ge=1, le=4096),
    UI(
        "CUDA graph max batch",
        _S,
        "cuda_graph_max_bs: the largest decode batch captured as a CUDA graph; more captured sizes, more "
        "graph memory (auto: by GPU memory and tp, 8 to 512)",
        unit=" seq",
        special="auto (by GPU memory)",
        none=0,
        engines=_ONLY,
    ),
]
DisableCudaGraph = Annotated[
    bool,
    UI("Disable CUDA graph", _S, "no CUDA-graph capture (saves its memory, decodes slower)", engines=_ONLY),
]
DisableRadixCache = Annotated[
    bool,
    UI(
        "Disable radix cache",
        _S,
        "no prefix reuse across requests; memory-neutral: cached prefixes live in the same KV pool and are "
        "evicted on demand, the radix tree itself is host memory",
        engines=_ONLY,
    ),
]
DataParallel = Annotated[
    int,
    Field(ge=1, le=4096),
    UI(
        "Data parallel (dp_size)",
        _S,
        "SGLang's --dp-size: replicas of the tp x pp group behind one router, each with the same memory per "
        "GPU; with DP attention, the attention of one tp group split into dp_size parts instead (dp_size "
        "divides tp)",
        engines=_ONLY,
    ),
]
EnableDpAttention = Annotated[
    bool,
    UI(
        "DP attention",
        _S,
        "enable_dp_attention: attention runs data-parallel over dp_size groups of tp / dp_size GPUs (each "
        "keeps its own KV pool, with the KV heads split tp / dp_size ways), the rest of the model "
        "tensor-parallel over tp",
        engines=_ONLY,
    ),
]
PageSize = Annotated[
    int | None,
    Field(ge=1, le=4096),
    UI(
        "KV page size",
        _S,
        "--page-size: tokens per KV page; the pool holds whole pages (max_total_num_tokens rounded down to "
        "a multiple) plus one page. Auto: 1, SGLang's default for the FlashInfer, Triton and FA3 backends "
        "(server_args.py _handle_page_size; FlashMLA forces 64, Cutlass MLA and FA4 128)",
        unit=" tokens",
        special="auto (1)",
        none=0,
        engines=_ONLY,
    ),
]
MaxTotalTokens = Annotated[
    int | None,
    Field(ge=1, le=(1 << 31) - 1),
    UI(
        "Max total tokens",
        _S,
        "--max-total-tokens: a cap on the KV pool's tokens; SGLang takes min(cap, what the memory gives) and "
        "a cap above it only warns (model_runner_kv_cache_mixin.py _apply_token_constraints). Without a GPU "
        "capacity the pool is this cap. Auto: no cap",
        unit=" tokens",
        step=1024,
        special="auto (no cap)",
        none=0,
        engines=_ONLY,
    ),
]
SwaFullTokensRatio = Annotated[
    float,
    Field(gt=0, le=1),
    UI(
        "SWA / full tokens",
        _S,
        "--swa-full-tokens-ratio: for models SGLang runs with a hybrid sliding-window pool, the sliding "
        "layers' pool holds this share of the full layers' tokens (default 0.8, server_args.py)",
        step=0.05,
        decimals=3,
        engines=_ONLY,
    ),
]
MambaFullMemoryRatio = Annotated[
    float,
    Field(gt=0, le=100),
    UI(
        "Mamba / full memory ratio",
        _S,
        "--mamba-full-memory-ratio: for hybrid models (attention beside gated DeltaNet, Mamba-2, short-conv "
        "or KDA layers), the recurrent-state pool takes ratio / (1 + ratio) of the memory left after the "
        "weights and the KV pool the rest (default 0.9, server_args.py; kv_cache_configurator.py "
        "_handle_max_mamba_cache)",
        step=0.05,
        decimals=3,
        engines=_ONLY,
    ),
]
MaxMambaCacheSize = Annotated[
    int | None,
    Field(ge=1, le=1 << 24),
    UI(
        "Max mamba cache size",
        _S,
        "--max-mamba-cache-size: request slots of a hybrid model's recurrent-state pool (SGLang allocates "
        "one more); max_running_requests is at most a third of it with the radix cache, all of it without. "
        "Auto: from mamba_full_memory_ratio (or max_running_requests when the radix cache is off)",
        unit=" slots",
        special="auto (by the ratio)",
        none=0,
        engines=_ONLY,
    ),
]
MambaSsmDtype = Annotated[
    Literal["auto", "float32", "bfloat16", "float16"],
    UI(
        "Mamba SSM dtype",
        _S,
        "--mamba-ssm-dtype: the dtype of a hybrid model's temporal (SSM) state; auto: float32, SGLang's "
        "default and what the configs naming mamba_ssm_dtype say (configs/mamba_utils.py "
        "mamba2_state_dtype); the conv state is bf16 whatever this is",
        engines=_ONLY,
    ),
]
