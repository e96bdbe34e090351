"""llama.cpp's own cache knobs beyond the shared inference fields, declared once (types, ranges, UI) and
listed in :class:`~gpumem_gui.core.runtimes.run.InferenceRun` with ``engines=("llama.cpp",)``.

Each default is llama.cpp's own (common/arg.cpp), with its source; the semantics live in :mod:`.llamacpp`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from gpumem_gui.core.fields import UI

_G = "llama.cpp"
_E = ("llama.cpp",)
_KV_VALUES = "f16, bf16, f32, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (empty or auto: the KV cache field)"


def _auto_is_none(value: object) -> object:
    """'auto' and an empty text mean "as the KV cache field": stored as None; a type name is at most 32
    characters (the KV cache field's own limit)."""
    if isinstance(value, str):
        if value.strip().lower() in ("", "auto"):
            return None
        if len(value) > 32:
            raise ValueError("a KV cache type name has at most 32 characters")
    return value


LlamaCacheTypeK = Annotated[
    str | None,
    BeforeValidator(_auto_is_none),
    UI(
        "K cache type (-ctk)",
        _G,
        "element type of the K cache (--cache-type-k); empty: the KV cache field",
        aliases=("-ctk",),
        values=_KV_VALUES,
        engines=_E,
    ),
]

LlamaCacheTypeV = Annotated[
    str | None,
    BeforeValidator(_auto_is_none),
    UI(
        "V cache type (-ctv)",
        _G,
        "element type of the V cache (--cache-type-v); a quantized V cache needs flash attention; empty: "
        "the KV cache field",
        aliases=("-ctv",),
        values=_KV_VALUES,
        engines=_E,
    ),
]

LlamaKvOffload = Annotated[
    bool,
    UI(
        "KV offload",
        _G,
        "llama.cpp's offload_kqv, on by default: each layer's KV lives where the layer runs (the GPU for "
        "offloaded layers, host memory for the rest); --no-kv-offload (-nkvo) keeps the whole KV cache in "
        "host memory",
        engines=_E,
    ),
]

LlamaSwaFull = Annotated[
    bool,
    UI(
        "Full-size SWA cache (--swa-full)",
        _G,
        "llama.cpp's --swa-full: sliding-window (and chunked-local) layers keep n_ctx cells like the full "
        "attention layers instead of their window + a micro-batch (src/llama-kv-cache-iswa.cpp: size_swa = "
        "size_base)",
        engines=_E,
    ),
]

LlamaMlaCache = Annotated[
    Literal["latent", "full"],
    UI(
        "MLA cache layout",
        _G,
        "DeepSeek-style MLA models: 'latent' caches the compressed latent (GGUFs that carry "
        "<arch>.attention.key_length_mla, read as n_embd_head_k_mla in src/llama-model.cpp); 'full' is an "
        "older GGUF conversion without it, which caches full per-head K (nope + rope) and V",
        choices=(("latent (current GGUF)", "latent"), ("full K/V (older GGUF)", "full")),
        engines=_E,
    ),
]

# common/common.h common_params: fit_params = true, fit_params_target = 1024 MiB per device,
# fit_params_min_ctx = 4096; common/arg.cpp -fit / -fitt; the fit itself: common/fit.cpp
# common_params_fit_impl (:mod:`.llamacpp_fit`)
LLAMA_FIT_TARGET_MIB = 1024

LlamaFit = Annotated[
    Literal["off", "on"],
    UI(
        "Automatic placement (--fit)",
        _G,
        "on: -ngl auto with --fit on (llama-server's own default): llama.cpp projects the model, KV, RS and "
        "compute buffers on the GPU and, when they leave less than the fit target free, keeps routed MoE "
        "experts and then whole layers in host memory until they do (common/fit.cpp "
        "common_params_fit_impl; -c is given, so it never lowers the context); off: the GPU layers field "
        "as given (-ngl all: every layer)",
        choices=(("off (-ngl as given)", "off"), ("on (-ngl auto --fit on)", "on")),
        engines=_E,
    ),
]

LlamaFitTargetMiB = Annotated[
    int,
    Field(ge=0, le=1 << 20),
    UI(
        "Fit target (--fit-target)",
        _G,
        "memory --fit leaves free on each GPU (-fitt, LLAMA_ARG_FIT_TARGET; llama.cpp's default 1024 MiB)",
        aliases=("-fitt",),
        unit=" MiB",
        step=256,
        engines=("llama.cpp", "ollama"),
    ),
]
