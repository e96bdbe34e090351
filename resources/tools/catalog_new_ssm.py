"""Catalog entries of the model types issue 14 adds, group ssm (Mamba-2 layers beside attention): family, size
label and the parameter count the publisher states, with its source; build_model_catalog checks each against
the exact count. The configs in resources/configs are recalled copies (not in verified.tsv)."""

from __future__ import annotations

from catalog_published import Model, label, stated

STATE_8B = (
    "Hybrid: 24 Mamba-2 layers keep a fixed 97.9 MiB state per sequence (bf16 conv + fp32 SSM state) beside "
    "the 4 attention layers' KV cache (16 KiB per token); 24 MLP-only layers."
)
STATE_9B = (
    "Hybrid: 27 Mamba-2 layers keep a fixed 137.5 MiB state per sequence (bf16 conv + fp32 SSM state) beside "
    "the 4 attention layers' KV cache (16 KiB per token); 25 MLP-only layers."
)
STATE_JAMBA = (
    "Hybrid MoE: 28 Mamba layers keep a fixed 15.8 MiB state per sequence (bf16 conv + fp32 SSM state) "
    "beside the 4 attention layers' KV cache (16 KiB per token); 16 experts, top-2, on every other layer. "
    "Model card: '12B active parameters and a total of 52B parameters across all experts'."
)
# the Open LLM Leaderboard's request file for ai21labs/Jamba-v0.1 (revision ce13f3fe): "params": 51.57
JAMBA_SRC = "open-llm-leaderboard/requests ai21labs/Jamba-v0.1_eval_request_False_bfloat16_Original.json"

MODELS: tuple[Model, ...] = (
    Model(
        "nvidia/Nemotron-H-8B-Base-8K",
        "Nemotron-H",
        "8B",
        label("8B", "nvidia/Nemotron-H-8B-Base-8K model name", STATE_8B),
    ),
    Model(
        "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
        "Nemotron-Nano-v2",
        "9B",
        label("9B", "nvidia/NVIDIA-Nemotron-Nano-9B-v2 model name", STATE_9B),
    ),
    Model("ai21labs/Jamba-v0.1", "Jamba", "52B-A12B", stated("51.57B", JAMBA_SRC, STATE_JAMBA)),
)
