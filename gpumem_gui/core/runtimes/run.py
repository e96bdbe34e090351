"""What an inference run is: :class:`InferenceRun`, every field declared once with its range and its UI.

The CLI flags, the window's Inference form, the copied command line and the README's flag table are all
generated from these declarations (:mod:`gpumem_gui.core.fields`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from gpumem_gui.core.errors import describe_validation_error
from gpumem_gui.core.fields import ATTN_CHOICES, UI, CudaContextMiB, GpuArchField, NcclChannels, image_fields
from gpumem_gui.core.replay.vision import has_tower
from gpumem_gui.core.runtimes.llamacpp_options import (
    LlamaCacheTypeK,
    LlamaCacheTypeV,
    LlamaFit,
    LlamaFitTargetMiB,
    LlamaKvOffload,
    LlamaMlaCache,
    LlamaSwaFull,
)
from gpumem_gui.core.runtimes.ollama_options import (
    OLLAMA_SERVER_ERA,
    OllamaFlashAttention,
    OllamaGpuOverheadMiB,
    OllamaNumBatch,
    OllamaNumCtx,
    OllamaNumGpu,
    OllamaNumParallel,
    OllamaSchedSpread,
    OllamaVersion,
)
from gpumem_gui.core.runtimes.sglang_options import (
    ChunkedPrefillSize,
    CudaGraphMaxBs,
    DataParallel,
    DisableCudaGraph,
    DisableRadixCache,
    EnableDpAttention,
    MambaFullMemoryRatio,
    MambaSsmDtype,
    MaxMambaCacheSize,
    MaxRunningRequests,
    MaxTotalTokens,
    MemFractionStatic,
    PageSize,
    SwaFullTokensRatio,
)
from gpumem_gui.core.runtimes.transformers_options import CacheImplementation
from gpumem_gui.core.runtimes.vllm_options import (
    VllmBlockSize,
    VllmEnforceEager,
    VllmEngine,
    VllmHybridKvCache,
    VllmImagesPerPrompt,
    VllmMaxCaptureSize,
    VllmMaxNumSeqs,
    VllmProfileCudagraphs,
    VllmTpLink,
)
from gpumem_gui.core.spec.cross_attention import cross_attention_layers
from gpumem_gui.core.spec.model import Frozen, ModelSpec

Engine = Literal["transformers", "vllm", "llama.cpp", "sglang", "ollama"]
ENGINES: tuple[str, ...] = ("transformers", "vllm", "llama.cpp", "sglang", "ollama")
COMPUTE_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

_W = "Workload"
_P = "Precision"
_PAR = "Parallelism"


def _degree(label: str, help: str, unit: str = "") -> object:
    return UI(label, _PAR, help, unit=unit)


def _takes_images(spec: ModelSpec) -> bool:
    """Whether images change ``spec``'s inference estimate: a replayed vision tower runs on them
    (replay/vision.py), or cross-attention layers cache their vision tokens (runtimes/cross_attention.py)."""
    return has_tower(spec) or bool(cross_attention_layers(spec))


_Images, _ImageSize = image_fields(
    "transformers",
    "cross-attention layers (Llama 3.2 Vision) keep their vision tokens' keys and values for the whole "
    "generation",
    _takes_images,
    ("transformers",),
)


class InferenceRun(Frozen):
    """Everything about an inference run that changes its memory (validated; see each field's help)."""

    batch: Annotated[
        int,
        Field(ge=1, le=1 << 20),
        UI("Batch", _W, "sequences processed together", unit=" seq"),
    ] = 1
    seq: Annotated[
        int,
        Field(ge=1, le=1 << 24),
        UI(
            "Prompt",
            _W,
            "prompt tokens per sequence; the context is prompt + new tokens",
            unit=" tokens",
            step=256,
        ),
    ] = 2048
    new_tokens: Annotated[
        int,
        Field(ge=0, le=1 << 24),
        UI(
            "New tokens",
            _W,
            "tokens generated per sequence (0: one forward over the prompt only)",
            unit=" tokens",
            step=64,
        ),
    ] = 0
    engine: Annotated[
        Engine,
        UI(
            "Engine",
            _W,
            "the runtime: each allocates memory its own way (transformers: op by op; vLLM: a paged KV pool "
            "sized from gpu_memory_utilization; llama.cpp: model, KV and compute buffers; SGLang: weights "
            "and a token pool within mem_fraction_static; Ollama: llama.cpp's buffers with the layers Ollama "
            "fits)",
            choices=(
                ("transformers (PyTorch)", "transformers"),
                ("vLLM", "vllm"),
                ("llama.cpp", "llama.cpp"),
                ("SGLang", "sglang"),
                ("Ollama", "ollama"),
            ),
        ),
    ] = "transformers"
    weights: Annotated[
        str,
        Field(min_length=1, max_length=64),
        UI(
            "Weights",
            _P,
            "weight format id (gpumem formats lists them: float, FP8, bitsandbytes, GPTQ/AWQ, MX/NV FP4, "
            "GGUF types and mixes), or 'file' for the bytes in the model's own safetensors/GGUF files; "
            "quantized formats count their scales and zero-points too",
            values="a format id (gpumem formats), or file",
            widget="weights",
        ),
    ] = "bf16"
    compute_dtype: Annotated[
        Literal["bf16", "fp16", "fp32"],
        UI("Compute dtype", _P, "activation dtype, and that of every tensor the weight format leaves as is"),
    ] = "bf16"
    kv_dtype: Annotated[
        str,
        Field(min_length=1, max_length=32),
        UI(
            "KV cache",
            _P,
            "KV-cache element type; what the engine accepts (auto = the compute dtype)",
            values="auto, or a KV dtype the engine takes (fp16, bf16, fp32; vLLM fp8*; SGLang fp8_e4m3, "
            "fp8_e5m2; llama.cpp q8_0, "
            "q4_0, ...; transformers int8, int4)",
            widget="kv_dtype",
        ),
    ] = "auto"
    attn: Annotated[
        Literal["sdpa", "eager", "flash"],
        UI(
            "Attention",
            "transformers",
            "attn_implementation: eager materialises the full score matrix; sdpa and flash do not",
            choices=ATTN_CHOICES,
            engines=("transformers",),
        ),
    ] = "sdpa"
    logits: Annotated[
        Literal["last", "all"],
        UI(
            "Logits",
            "transformers",
            "keep logits of the last position (generate) or of all positions (an evaluation forward)",
            choices=(("last position (generate)", "last"), ("all positions (eval forward)", "all")),
            engines=("transformers",),
        ),
    ] = "last"
    cache_implementation: CacheImplementation = "dynamic"
    bnb_compute_dtype: Annotated[
        Literal["auto", "fp32", "bf16", "fp16"],
        UI(
            "4-bit compute",
            "transformers",
            "bitsandbytes 4-bit (nf4, fp4) weights: bnb_4bit_compute_dtype, the dtype each linear's input "
            "and dequantized weight are cast to (auto: the compute dtype; transformers' BitsAndBytesConfig "
            "defaults to fp32)",
            engines=("transformers",),
        ),
    ] = "auto"
    images: _Images = 0
    image_size: _ImageSize = 1024
    tp: Annotated[
        int,
        Field(ge=1, le=4096),
        _degree("Tensor parallel", "tensor-parallel degree: divides the heads", " GPUs"),
    ] = 1
    pp: Annotated[
        int,
        Field(ge=1, le=4096),
        _degree(
            "Pipeline parallel",
            "pipeline stages: at most the layers (Ollama: the GPUs it may split the layers over, "
            "CUDA_VISIBLE_DEVICES)",
            " stages",
        ),
    ] = 1
    ep: Annotated[
        int,
        Field(ge=1, le=4096),
        _degree("Expert parallel", "expert-parallel degree (MoE): divides the experts, at most tp x pp"),
    ] = 1
    gpu_memory_utilization: Annotated[
        float,
        Field(gt=0, le=1),
        UI(
            "GPU memory utilization",
            "vLLM",
            "the share of each GPU's memory vLLM may take; the KV pool gets what is left of it after "
            "weights, activations and CUDA graphs",
            step=0.01,
            engines=("vllm",),
        ),
    ] = 0.9
    max_num_seqs: VllmMaxNumSeqs = None
    max_model_len: Annotated[
        int | None,
        Field(ge=1, le=1 << 24),
        UI(
            "Max model length",
            _W,
            "the longest request (vLLM --max-model-len, SGLang --context-length); vLLM: one such request "
            "must fit in the KV pool (default: prompt + new tokens); SGLang: sizes the request-to-token pool "
            "(default: the model's context length)",
            unit=" tokens",
            step=1024,
            special="auto",
            none=0,
            engines=("vllm", "sglang"),
        ),
    ] = None
    max_num_batched_tokens: Annotated[
        int | None,
        Field(ge=1, le=1 << 24),
        UI(
            "Max batched tokens",
            "vLLM",
            "tokens in the profiling forward (default 8192)",
            unit=" tokens",
            step=1024,
            special="auto (8192)",
            none=0,
            engines=("vllm",),
        ),
    ] = None
    enforce_eager: VllmEnforceEager = False
    max_cudagraph_capture_size: VllmMaxCaptureSize = None
    profile_cudagraphs: VllmProfileCudagraphs = True
    vllm_engine: VllmEngine = "v1"
    tp_link: VllmTpLink = "auto"
    block_size: VllmBlockSize = 16
    hybrid_kv_cache: VllmHybridKvCache = True
    images_per_prompt: VllmImagesPerPrompt = None
    mem_fraction_static: MemFractionStatic = None
    chunked_prefill_size: ChunkedPrefillSize = None
    max_running_requests: MaxRunningRequests = None
    cuda_graph_max_bs: CudaGraphMaxBs = None
    disable_cuda_graph: DisableCudaGraph = False
    disable_radix_cache: DisableRadixCache = False
    page_size: PageSize = None
    max_total_tokens: MaxTotalTokens = None
    swa_full_tokens_ratio: SwaFullTokensRatio = 0.8
    mamba_full_memory_ratio: MambaFullMemoryRatio = 0.9
    max_mamba_cache_size: MaxMambaCacheSize = None
    mamba_ssm_dtype: MambaSsmDtype = "auto"
    dp_size: DataParallel = 1
    enable_dp_attention: EnableDpAttention = False
    n_gpu_layers: Annotated[
        int,
        Field(ge=-1, le=4096),
        UI(
            "GPU layers (-ngl)",
            "llama.cpp",
            "layers offloaded to the GPU, the output layer counted first as current llama.cpp does (k: the "
            "output layer and the last k - 1 blocks; -1: all); the rest stay in host memory",
            aliases=("-ngl",),
            special="all layers",
            engines=("llama.cpp",),
        ),
    ] = -1
    n_batch: Annotated[
        int,
        Field(ge=1, le=1 << 20),
        UI(
            "Logical batch (-b)",
            "llama.cpp",
            "logical batch size; at least the physical batch (default 2048, or -ub when that is larger)",
            aliases=("-b",),
            unit=" tokens",
            step=256,
            engines=("llama.cpp",),
        ),
    ] = 2048
    n_ubatch: Annotated[
        int,
        Field(ge=1, le=1 << 20),
        UI(
            "Physical batch (-ub)",
            "llama.cpp",
            "physical micro-batch; sizes the compute buffer",
            aliases=("-ub",),
            unit=" tokens",
            step=128,
            engines=("llama.cpp",),
        ),
    ] = 512
    flash_attn: Annotated[
        bool,
        UI(
            "Flash attention",
            "llama.cpp",
            "llama.cpp's -fa; without it the KQ matrix is materialised",
            engines=("llama.cpp",),
        ),
    ] = True
    cache_type_k: LlamaCacheTypeK = None
    cache_type_v: LlamaCacheTypeV = None
    kv_offload: LlamaKvOffload = True
    swa_full: LlamaSwaFull = False  # common/arg.cpp --swa-full (common_params::swa_full = false)
    mla_cache: LlamaMlaCache = "latent"
    fit: LlamaFit = "off"  # gpumem's -ngl all, which llama.cpp's fit leaves alone (common/fit.cpp)
    fit_target_mib: LlamaFitTargetMiB = 1024  # LLAMA_FIT_TARGET_MIB: common/common.h fit_params_target
    num_ctx: OllamaNumCtx = None
    num_parallel: OllamaNumParallel = None
    flash_attention: OllamaFlashAttention = "auto"
    num_gpu: OllamaNumGpu = None
    num_batch: OllamaNumBatch = None
    gpu_overhead_mib: OllamaGpuOverheadMiB = 0
    sched_spread: OllamaSchedSpread = False
    ollama_version: OllamaVersion = OLLAMA_SERVER_ERA  # Ollama >= 0.30 (llama-server); why: its help
    cuda_context_mib: CudaContextMiB = None
    gpu_arch: GpuArchField = "auto"
    nccl_channels: NcclChannels

    @model_validator(mode="before")
    @classmethod
    def _default_n_batch(cls, data: Any) -> Any:
        """llama.cpp's -b defaults to 2048 and must hold -ub: without -b, a larger -ub raises it too."""
        if isinstance(data, dict) and data.get("n_batch") is None and "n_ubatch" in data:
            ub = data["n_ubatch"]
            if isinstance(ub, int) and ub > 2048:
                data = {**data, "n_batch": ub}
        return data

    @model_validator(mode="after")
    def _check(self) -> InferenceRun:
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must be at most n_batch ({self.n_batch})")
        return self

    @property
    def tokens(self) -> int:
        return self.seq + self.new_tokens

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def dt(self) -> int:
        return COMPUTE_DTYPE_BYTES[self.compute_dtype]

    @property
    def kv_dtype_resolved(self) -> str:
        return self.compute_dtype if self.kv_dtype == "auto" else self.kv_dtype


def make_run(**fields: object) -> InferenceRun:
    """Build an :class:`InferenceRun`; a bad value is one :class:`GpumemInputError` naming the field."""
    try:
        return InferenceRun(**fields)  # type: ignore[arg-type]
    except ValidationError as e:
        raise describe_validation_error(e, source="run") from None
