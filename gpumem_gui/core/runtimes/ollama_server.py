"""Ollama v0.30+: upstream llama-server under Ollama's arguments and defaults (``ollama_version`` 0.30+).

From commit 9db4bdbad (#16031, first in v0.30.0) Ollama serves every GGUF model with llama.cpp's own
``llama-server`` (the build in ``LLAMA_CPP_VERSION``: b10488 at v0.33). ``llm/llama_server.go``
``startLlamaServer`` passes ``-c num_ctx x numParallel -np numParallel``, ``--cache-type-k/-v`` from
``OLLAMA_KV_CACHE_TYPE``, ``--flash-attn auto`` (or on/off when ``OLLAMA_FLASH_ATTENTION`` is set:
``appendFlashAttentionArgs``), ``-b num_batch -ub num_batch`` (``appendBatchArgs``) and ``-ngl`` only when
num_gpu is set; otherwise llama-server's own ``--fit`` places the layers (:mod:`.llamacpp_fit`). The bytes are
the llama.cpp profile's (:mod:`.llamacpp`: model, KV, recurrent-state and compute buffers, so every hybrid
llama.cpp runs is sized as llama.cpp sizes it); this module holds Ollama's defaults for those arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import WeightBytes
from gpumem_gui.core.gpu_memory import GpuMemory
from gpumem_gui.core.runtimes.ollama_options import OLLAMA_DEFAULT_NUM_BATCH, OLLAMA_DEFAULT_NUM_CTX
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB, MiB

# server/sched.go Scheduler.load (v0.33): "Some architectures are not safe with num_parallel > 1" (issue
# #4165): numParallel = 1 for these model families (GGUF general.architecture)
SERIAL_ARCHS = frozenset(
    {
        "mllama",
        "qwen3vl",
        "qwen3vlmoe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "nemotron_h_omni",
    }
)
# server/routes.go Serve: the default num_ctx by total VRAM (sum of TotalMemory - OLLAMA_GPU_OVERHEAD over the
# GPUs), "slightly lower thresholds (47/23 GiB vs. 48/24 GiB)"; below 23 GiB: 4096
CTX_BY_VRAM = ((47 * GiB, 262144), (23 * GiB, 32768))
# server/sched.go generationBatchForContext / generationBatchHasHeadroom / generationBatchSurcharge: (batch,
# context above which it is chosen, share of the free memory the prediction may take, surcharge)
AUTO_BATCHES = ((2048, 32768, 60, 2 * GiB), (1024, 4096, 75, 768 * MiB))
# server/sched.go llamaServerGenerationBatchConstrained: CUDA without flash attention, context > 4096, a GPU
# of at most 8 GiB
CONSTRAINED_BATCH = 256
# server/sched.go bestSingleGPUFit / generationBatchFits: the prediction must stay within 80 % of free memory
FIT_SHARE = 80
# the KV types Ollama documents for OLLAMA_KV_CACHE_TYPE (docs/faq.md), as the run's kv_dtype ids
_KV = {"auto": None, "fp16": "fp16", "f16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0"}


@dataclass(frozen=True)
class ServerSettings:
    """What Ollama v0.30+ hands llama-server for a run, and the notes of how it got there."""

    num_ctx: int  # per request slot, after the clamp to the model's training context
    parallel: int
    batch: int  # -b and -ub
    flash: bool
    kv_dtype: str  # the llama.cpp run's kv_dtype ("fp16": llama.cpp's default)
    warnings: tuple[str, ...]


def server_kv_type(run: InferenceRun) -> str:
    """The KV type Ollama passes as --cache-type-k/-v (OLLAMA_KV_CACHE_TYPE), as the llama.cpp run's kv_dtype
    (fp16 when it passes none: llama.cpp's default f16)."""
    return _KV.get(run.kv_dtype.lower()) or "fp16"


def default_num_ctx(total_vram: int) -> int:
    """server/routes.go Serve: 262144 from 47 GiB of total VRAM, 32768 from 23 GiB, else 4096."""
    return next((ctx for floor, ctx in CTX_BY_VRAM if total_vram >= floor), OLLAMA_DEFAULT_NUM_CTX)


def predict_server_vram(spec: ModelSpec, wb: WeightBytes, ctx: int) -> int:
    """llm/llama_server.go PredictServerVRAM: the model file's size (here its GGUF weight bytes) plus an f16
    K and V of ``ctx`` tokens for every block at the fewest KV heads and head size = hidden / most heads."""
    head = spec.hidden_size // spec.num_attention_heads
    return wb.total_bytes + 2 * spec.num_layers * spec.num_kv_heads * head * ctx * 2


def auto_num_batch(ctx: int, predicted: int, free: int, flash: str, gpu_bytes: int) -> int:
    """server/sched.go automaticGenerationBatch (CUDA): 512 (or 256 on a GPU of 8 GiB or less above 4096
    tokens) with flash attention turned off; else 2048 above 32768 tokens, 1024 above 4096, lowered while the
    prediction leaves too little of the free memory (``free`` 0: unknown, no check)."""
    if flash == "off":
        small = ctx > 4096 and 0 < gpu_bytes <= 8 * GiB
        return CONSTRAINED_BATCH if small else OLLAMA_DEFAULT_NUM_BATCH
    for batch, above, share, surcharge in AUTO_BATCHES:
        if ctx <= above:
            continue
        limit = free * FIT_SHARE // 100
        if not free or (predicted <= free * share // 100 and surcharge <= limit - predicted):
            return batch
    return OLLAMA_DEFAULT_NUM_BATCH


def server_settings(
    spec: ModelSpec, run: InferenceRun, gpu: GpuMemory | None, wb: WeightBytes
) -> ServerSettings:
    """Ollama v0.33's num_ctx, parallel slots, batch, flash attention and KV type for ``run`` on ``run.pp``
    GPUs of ``gpu``'s memory (server/routes.go, server/sched.go, llm/server.go NewLlamaServer)."""
    warns: list[str] = []
    free = gpu.cuda_bytes if gpu else 0
    total_vram = run.pp * max(free - run.gpu_overhead_mib * MiB, 0)
    tier = default_num_ctx(total_vram)
    num_ctx = run.num_ctx or max(tier, run.tokens)
    if run.num_ctx is None:
        why = f"{total_vram / GiB:.1f} GiB of total VRAM" if gpu else "no GPU memory given"
        warns.append(f"num_ctx: Ollama's default for {why} is {tier} (server/routes.go)")
        if run.tokens > tier:
            warns.append(
                f"num_ctx: the run's {run.tokens} tokens need num_ctx {run.tokens}, which it assumes"
            )
    parallel = run.num_parallel or run.batch
    if (spec.traits.gguf_arch or "") in SERIAL_ARCHS and parallel > 1:
        warns.append(
            f"num_parallel: Ollama serves {spec.traits.gguf_arch} one request at a time (server/sched.go)"
        )
        parallel = 1
    train = spec.max_position_embeddings
    if num_ctx > train:
        warns.append(f"num_ctx: {num_ctx} exceeds the model's training context {train}; Ollama uses {train}")
        num_ctx = train
    kv = server_kv_type(run)
    if run.kv_dtype.lower() not in _KV:
        warns.append(f"kv_dtype: OLLAMA_KV_CACHE_TYPE takes f16, q8_0, q4_0, not {run.kv_dtype!r}: f16")
    if kv != "fp16" and run.flash_attention == "off":
        warns.append(f"kv_dtype: llama.cpp refuses a quantized V cache ({kv}) without flash attention")
    batch = run.num_batch
    if batch is None:
        predicted = predict_server_vram(spec, wb, num_ctx * parallel)
        batch = auto_num_batch(
            num_ctx * parallel, predicted, free, run.flash_attention, gpu.cuda_bytes if gpu else 0
        )
        warns.append(
            f"num_batch: Ollama picks {batch} (server/sched.go automaticGenerationBatch; -b and -ub)"
        )
    if run.tokens > num_ctx:
        warns.append(
            f"seq: prompt + new tokens ({run.tokens}) exceed num_ctx ({num_ctx}); Ollama keeps num_ctx"
        )
    if spec.vision is not None:
        warns.append("the vision projector (--mmproj, and its fit-target raise) is not counted")
    if run.gpu_overhead_mib:
        warns.append(
            "gpu_overhead_mib: v0.30+ takes OLLAMA_GPU_OVERHEAD off the VRAM behind the default num_ctx only "
            "(server/routes.go); llama-server's --fit leaves the fit target free instead"
        )
    # --flash-attn auto: llama.cpp turns it on where the GPU backend runs the model's attention (CUDA does)
    return ServerSettings(num_ctx, parallel, batch, run.flash_attention != "off", kv, tuple(warns))


def check_parallelism(run: InferenceRun) -> None:
    """Ollama has no tensor or expert parallelism (one-line error)."""
    if run.tp * run.ep > 1:
        raise GpumemInputError(
            "Ollama has no tensor or expert parallelism (it splits the layers over GPUs by free memory: "
            "give the GPUs as pp): use tp=1, ep=1",
            field="tp" if run.tp > 1 else "ep",
        )


def server_gpus(
    spec: ModelSpec, run: InferenceRun, gpu: GpuMemory | None, wb: WeightBytes, ctx: int
) -> tuple[int, str]:
    """server/sched.go selectLlamaServerPlacement: how many of the ``pp`` GPUs llama-server gets, and a note.
    With several GPUs and no OLLAMA_SCHED_SPREAD, a model predicted within 80 % of one GPU's free memory loads
    on that GPU alone (``--split-mode none --main-gpu 0``, bestSingleGPUFit); otherwise on all of them
    (bestGPUGroupByAvailableMemory), where llama-server splits the layers."""
    if run.pp == 1:
        return 1, ""
    predicted = predict_server_vram(spec, wb, ctx)
    if gpu is None:
        return run.pp, f"no GPU memory given: Ollama's choice of GPUs is taken as all {run.pp}"
    if not run.sched_spread and predicted <= gpu.cuda_bytes * FIT_SHARE // 100:
        return 1, (
            f"Ollama loads the model on one of the {run.pp} GPUs: its prediction, {predicted / GiB:.1f} GiB, "
            "is within 80 % of one GPU's free memory (server/sched.go bestSingleGPUFit)"
        )
    return run.pp, f"Ollama gives llama-server all {run.pp} GPUs (its prediction: {predicted / GiB:.1f} GiB)"
