"""Ollama v0.12.10's run settings: what its llama runner hands llama.cpp (llm/server.go NewLlamaServer)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumem_gui.core.runtimes.ollama_options import OLLAMA_DEFAULT_NUM_BATCH, OLLAMA_DEFAULT_NUM_CTX
from gpumem_gui.core.runtimes.ollama_predict import FLASH_BY_DEFAULT
from gpumem_gui.core.runtimes.run import InferenceRun
from gpumem_gui.core.spec.kinds_of import model_kinds
from gpumem_gui.core.spec.model import ModelSpec

# the KV types Ollama passes on (fs/ggml/ggml.go SupportsKVCacheType) as the run's kv_dtype ids
KV_OLLAMA = {"auto": "f16", "fp16": "f16", "f16": "f16", "q8_0": "q8_0", "q4_0": "q4_0"}


@dataclass(frozen=True)
class OllamaSettings:
    """What Ollama hands llama.cpp for a run, and the warnings of how it got there."""

    num_ctx: int  # per request slot, after the clamp to the model's training context
    parallel: int
    batch: int  # min(num_batch, num_ctx)
    flash: bool
    kv_type: str  # Ollama's spelling: f16, q8_0, q4_0
    warnings: tuple[str, ...]


def flash_supported(spec: ModelSpec) -> bool:
    """fs/ggml/ggml.go SupportsFlashAttention: K and V head sizes equal, not gemma2."""
    if spec.traits.gguf_arch == "gemma2":
        return False
    mla = model_kinds(spec).latent
    if mla is not None:
        return mla.qk_nope_head_dim + mla.qk_rope_head_dim == mla.v_head_dim
    return True


def ollama_settings(spec: ModelSpec, run: InferenceRun) -> OllamaSettings:
    """Ollama's context, batch, flash attention and KV type for ``run`` (llm/server.go NewLlamaServer)."""
    warns: list[str] = []
    num_ctx = run.num_ctx or max(OLLAMA_DEFAULT_NUM_CTX, run.tokens)
    if run.num_ctx is None and run.tokens > OLLAMA_DEFAULT_NUM_CTX:
        warns.append(
            f"num_ctx: Ollama's default is {OLLAMA_DEFAULT_NUM_CTX}; the run's {run.tokens} tokens need "
            f"num_ctx {run.tokens} (OLLAMA_CONTEXT_LENGTH), which the estimate assumes"
        )
    parallel = run.num_parallel or run.batch
    if run.num_parallel is None and run.batch > 1:
        warns.append(
            f"num_parallel: Ollama's default is 1; {run.batch} requests at once need OLLAMA_NUM_PARALLEL="
            f"{run.batch}, which the estimate assumes"
        )
    train = spec.max_position_embeddings
    if num_ctx > train:
        warns.append(f"num_ctx: {num_ctx} exceeds the model's training context {train}; Ollama uses {train}")
        num_ctx = train
    want = {"auto": (spec.traits.gguf_arch or "") in FLASH_BY_DEFAULT, "on": True, "off": False}
    flash = want[run.flash_attention]
    if flash and not flash_supported(spec):
        warns.append(
            "flash_attention: the model's K and V head sizes differ (or gemma2); Ollama turns it off"
        )
        flash = False
    asked = KV_OLLAMA.get(run.kv_dtype.lower())
    if asked is None:
        warns.append(
            f"kv_dtype: Ollama's OLLAMA_KV_CACHE_TYPE takes f16, q8_0, q4_0, not {run.kv_dtype!r}: f16"
        )
        asked = "f16"
    if asked != "f16" and not flash:
        warns.append(
            f"kv_dtype: {asked} needs flash attention, which is off; Ollama keeps the KV cache in f16"
        )
        asked = "f16"
    if run.tokens > num_ctx:
        warns.append(
            f"seq: prompt + new tokens ({run.tokens}) exceed num_ctx ({num_ctx}); Ollama keeps num_ctx "
            "tokens per request (set num_ctx to hold them)"
        )
    if run.batch > parallel:
        warns.append(
            f"batch: {run.batch} sequences but OLLAMA_NUM_PARALLEL={parallel}; Ollama queues the rest"
        )
    if spec.vision is not None:
        warns.append("Ollama's vision projector (weights and image graph) is not counted")
    batch = min(run.num_batch or OLLAMA_DEFAULT_NUM_BATCH, num_ctx)
    return OllamaSettings(num_ctx, parallel, batch, flash, asked, tuple(warns))
