"""Why an engine's profile refuses a layer kind or a hybrid setup: one line each, with the source saying so.

Two kinds of refusal, kept apart in the wording: the engine itself does not run the model (its architecture
is not in the engine's registry at the version gpumem models, or was removed, named with the last version that
had it), or the engine runs it and gpumem does not model that arithmetic yet. The engines attach these lines
as capabilities (``Runtime.cross_attention_refusal``, ``Runtime.state_refusals``,
``Runtime.compressed_attention_refusal``); nothing here tests a name.
"""

from __future__ import annotations

from types import MappingProxyType

# --- cross-attention (Llama 3.2 Vision, MllamaForConditionalGeneration) ---

VLLM_CROSS_ATTENTION = (
    "vllm: vLLM does not run Llama 3.2 Vision (mllama) any more: V1 dropped it with the encoder-decoder "
    "models (vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS: "
    "MllamaForConditionalGeneration, last in v0.10.2); use the transformers engine"
)
LLAMACPP_CROSS_ATTENTION = (
    "llama.cpp: llama.cpp has no mllama architecture (src/llama-arch.cpp; LLM_ARCH_MLLAMA lived only in "
    "Ollama's llama/patches/0007-add-mllama-support.patch, up to Ollama v0.6); use the transformers engine"
)
OLLAMA_CROSS_ATTENTION = (
    "ollama v0.12.10: Ollama runs Llama 3.2 Vision on its own Go engine, not the llama runner gpumem models "
    "(fs/ggml/ggml.go OllamaEngineRequired lists mllama; model/models/mllama, since #10637); its cache there "
    "is not modelled; use the transformers engine"
)
OLLAMA_SERVER_CROSS_ATTENTION = (
    "ollama v0.30+: Ollama no longer runs Llama 3.2 Vision: it serves every GGUF model with upstream "
    "llama-server (commit 9db4bdbad, #16031, removed its Go engine for GGML models), and llama.cpp has no "
    "mllama architecture (src/llama-arch.cpp); use the transformers engine"
)

# --- recurrent-state mixers an engine does not size ---

SGLANG_STATE = MappingProxyType(
    {
        "mamba1": (
            "sglang: SGLang's state pool has no Mamba-1 (Jamba) layout: configs/hybrid_arch.py "
            "mambaish_config takes the Mamba-2, gated DeltaNet, KDA, Bailing lightning and RWKV-7 configs "
            "and configs/mamba_utils.py has no Mamba-1 state shape (main 02e208d; a Jamba port with one, "
            "091dfb1, is not in it); use vllm, llama.cpp or the transformers engine"
        ),
        "lightning": (
            "sglang: SGLang does not run MiniMax-Text-01 / M1 (lightning attention): no "
            "MiniMaxText01ForCausalLM in its models (tracking issue #18458; PRs #8124 and #11466 closed "
            "unmerged; its lightning pool serves Bailing's hybrid only); use llama.cpp or the transformers "
            "engine"
        ),
    }
)
OLLAMA_STATE = MappingProxyType(
    {
        "gated_deltanet": (
            "ollama v0.12.10: its llama runner has no gated DeltaNet (Qwen3-Next / Qwen3.5: no qwen3next in "
            "its vendored llama/llama.cpp/src/llama-arch.cpp); Ollama ran Qwen3-Next from v0.15.5 and "
            "Qwen3.5 from v0.17.1 on its Go engine (model/models/qwen3next, not modelled), and both from "
            "v0.30 on llama-server: use ollama_version 0.30+ or llama.cpp"
        ),
        "kda": (
            "ollama: v0.12.10 does not run Kimi-Linear (KDA): no kimi-linear in its vendored "
            "llama/llama.cpp/src/llama-arch.cpp nor a Go model in model/models (llama.cpp added it in PR "
            "#18755, January 2026, which Ollama v0.30+ runs through llama-server): use ollama_version 0.30+ "
            "or llama.cpp"
        ),
        "lightning": (
            "ollama: v0.12.10 does not run MiniMax-Text-01 (lightning attention): no minimax-01 in its "
            "vendored llama/llama.cpp/src/llama-arch.cpp nor a Go model in model/models (llama.cpp added it "
            "in PR #27018, August 2026; ollama_version 0.30+ sizes it as llama.cpp does, unverified for its "
            "pinned build b10488): use llama.cpp"
        ),
    }
)

# --- compressed attention (DeepSeek-V4, spec/compressed.py): vLLM, SGLang and llama.cpp model it
# (runtimes/vllm_dsv4.py, sglang_dsv4.py, llamacpp_dsv4.py); what each other engine itself does with such a
# model (Runtime.check_layer_kinds prefixes the engine and the mode) ---

COMPRESSED_ATTENTION = "its profile does not model DeepSeek-V4's compressed attention"
OLLAMA_COMPRESSED_ATTENTION = (
    "Ollama v0.12.10's llama runner predates llama.cpp's DeepSeek-V4 support (ggml-org/llama.cpp PR #24162); "
    "use llama.cpp, vllm or sglang (or ollama_version 0.30+)"
)

# --- Ollama v0.30+: what it runs through llama-server but gpumem's profile flags ---

OLLAMA_SERVER_LIGHTNING = (
    "ollama v0.30+: MiniMax-Text-01's lightning layers are sized as llama.cpp's (PR #27018, August 2026); "
    "whether Ollama's pinned llama.cpp b10488 (LLAMA_CPP_VERSION, August 18, 2026) has them is not verified"
)
