"""Ollama's run fields, declared once (types, ranges, UI) and listed in
:class:`~gpumem_gui.core.runtimes.run.InferenceRun` with ``engines=("ollama",)``.

Each default is Ollama's own, with its source (github.com/ollama/ollama, the version named). The KV-cache type
is the run's ``kv_dtype`` (``OLLAMA_KV_CACHE_TYPE``): ``auto`` is Ollama's f16, and Ollama applies a quantized
type only with flash attention (:mod:`.ollama`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI

_O = "Ollama"
_E = ("ollama",)

# api/types.go DefaultOptions NumCtx = envconfig.ContextLength(): 2048 up to v0.6.6, 4096 from v0.6.7
# (envconfig/config.go OLLAMA_CONTEXT_LENGTH); from v0.15.5 the server picks 4096/32768/262144 by total VRAM
# (server/routes.go Serve: < 23 GiB / < 47 GiB / more) unless num_ctx or OLLAMA_CONTEXT_LENGTH is set
OLLAMA_DEFAULT_NUM_CTX = 4096
# api/types.go DefaultOptions NumBatch
OLLAMA_DEFAULT_NUM_BATCH = 512

OllamaNumCtx = Annotated[
    int | None,
    Field(ge=1, le=1 << 24),
    UI(
        "Context (num_ctx)",
        _O,
        "tokens of context per request slot (num_ctx / OLLAMA_CONTEXT_LENGTH); the KV cache holds num_ctx x "
        "num_parallel cells; auto: Ollama's 4096 (0.6.7 to 0.15.4), or prompt + new tokens when longer (the "
        "setting the run needs; Ollama itself would truncate)",
        unit=" tokens",
        step=1024,
        special="auto",
        none=0,
        engines=_E,
    ),
]
OllamaNumParallel = Annotated[
    int | None,
    Field(ge=1, le=1024),
    UI(
        "Parallel requests",
        _O,
        "OLLAMA_NUM_PARALLEL: request slots of one loaded model, each with num_ctx of KV; auto: the run's "
        "batch (Ollama's own default is 1 since 0.10.0, before that 4 when memory allowed; more requests "
        "queue)",
        unit=" slots",
        special="auto (batch)",
        none=0,
        engines=_E,
    ),
]
OllamaFlashAttention = Annotated[
    Literal["auto", "on", "off"],
    UI(
        "Flash attention",
        _O,
        "OLLAMA_FLASH_ATTENTION: auto = the model's default (on for gemma3, gpt-oss, qwen3, qwen3moe); "
        "Ollama turns it off for a model whose K and V head sizes differ; a quantized KV cache needs it",
        choices=(("auto (model default)", "auto"), ("on", "on"), ("off", "off")),
        engines=_E,
    ),
]
OllamaNumGpu = Annotated[
    int | None,
    Field(ge=0, le=4096),
    UI(
        "GPU layers (num_gpu)",
        _O,
        "layers on the GPU, the output layer counted as one (num_gpu); auto: Ollama places as many as fit "
        "in the GPU's memory",
        special="auto (as many as fit)",
        none=-1,
        engines=_E,
    ),
]
OllamaNumBatch = Annotated[
    int | None,
    Field(ge=1, le=1 << 20),
    UI(
        "Batch (num_batch)",
        _O,
        "num_batch: tokens per llama.cpp batch; sizes the compute graph (v0.12.10: the micro-batch is at "
        "most 512; v0.30+: -b and -ub both); auto: 512 (api/types.go DefaultOptions), v0.30+: Ollama's own "
        "512 / 1024 / 2048 by context and predicted memory (server/sched.go automaticGenerationBatch)",
        unit=" tokens",
        step=128,
        special="auto",
        none=0,
        engines=_E,
    ),
]
OllamaGpuOverheadMiB = Annotated[
    int,
    Field(ge=0, le=1 << 20),
    UI(
        "GPU overhead",
        _O,
        "OLLAMA_GPU_OVERHEAD (given here in MiB; Ollama reads bytes): memory per GPU Ollama leaves unused "
        "when it places layers",
        unit=" MiB",
        step=256,
        engines=_E,
    ),
]
OllamaSchedSpread = Annotated[
    bool,
    UI(
        "Spread over all GPUs",
        _O,
        "OLLAMA_SCHED_SPREAD: load the model on every GPU (pp of them) rather than the fewest that hold "
        "every layer (Ollama's default, llm/server.go pickBestFullFitByLibrary)",
        engines=_E,
    ),
]

# the llama.cpp build Ollama v0.30+ fetches for llama-server (LLAMA_CPP_VERSION, read by
# llama/server/CMakeLists.txt FetchContent; v0.33.0-rc2)
OLLAMA_LLAMA_CPP = "b10488"
OLLAMA_RUNNER_ERA = "0.12.10"
OLLAMA_SERVER_ERA = "0.30+"

OllamaVersion = Annotated[
    Literal["0.12.10", "0.30+"],
    UI(
        "Ollama version",
        _O,
        "0.30+ (the default: Ollama's releases since v0.30, which users run, and gpumem places every model "
        "under them, a MoE model whose experts spill over several GPUs too): Ollama launches upstream "
        "llama-server (llama.cpp "
        f"{OLLAMA_LLAMA_CPP} at v0.33; commit 9db4bdbad, #16031) with -c num_ctx x parallel, -b/-ub "
        "num_batch, --flash-attn auto, and llama.cpp's own --fit placement unless num_gpu is set; "
        "0.12.10: an older Ollama's llama runner (vendored llama.cpp) with Ollama's own layer placement "
        "(llm/memory.go), for its logs",
        choices=(("v0.30+ (llama-server, the default)", "0.30+"), ("v0.12.10 (llama runner)", "0.12.10")),
        engines=_E,
    ),
]
