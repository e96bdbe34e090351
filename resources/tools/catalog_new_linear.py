"""Catalog entries of the model types issue 14 adds, group linear (recurrent layers beside MoE feed-forwards):
family, size label and the parameter count the publisher states, with its source; build_model_catalog checks
each against the exact count."""

from __future__ import annotations

from catalog_published import Model, label, stated

# LiquidAI/LFM2-8B-A1B model card, 'Model details': "Total parameters: 8.3B, 1.5B active"
LFM2_MOE_CARD = "LiquidAI/LFM2-8B-A1B model card, 'Model details' (8.3B total, 1.5B active)"
LFM2_MOE_NOTE = (
    "Hybrid MoE: 18 gated short-convolution layers (a conv state per sequence) and 6 attention layers; "
    "32 experts top-4 on all but the first two layers."
)

# MiniMaxAI/MiniMax-Text-01 model card, 'Model Architecture': "Total Parameters: 456B, Activated Parameters
# per Token: 45.9B"; the -hf repository holds the same weights in transformers' MiniMaxForCausalLM layout
MINIMAX_CARD = "MiniMaxAI/MiniMax-Text-01 model card, 'Model Architecture' (456B total, 45.9B activated)"
MINIMAX_NOTE = (
    "Hybrid: 70 lightning-attention layers keep a fixed 140 MiB state per sequence (bf16 K^T V sums) beside "
    "the 10 softmax-attention layers' KV cache; 32 experts top-2 on every layer."
)

# moonshotai/Kimi-Linear-48B-A3B-Instruct model card, the models table: "#Total Params 48B, #Activated Params
# 3B" (MoonshotAI/Kimi-Linear README.md)
KIMI_LINEAR_CARD = (
    "moonshotai/Kimi-Linear-48B-A3B-Instruct model card, models table (48B total, 3B activated)"
)
KIMI_LINEAR_NOTE = (
    "Hybrid: 20 Kimi Delta Attention layers keep a fixed 41.9 MiB state per sequence (fp32 per-head state, "
    "conv state) beside the 7 MLA layers' latent cache (8 KB per token); 256 experts top-8 + 1 shared."
)

MODELS: tuple[Model, ...] = (
    Model("LiquidAI/LFM2-8B-A1B", "LFM2-MoE", "8B-A1B", stated("8.3B", LFM2_MOE_CARD, LFM2_MOE_NOTE)),
    Model(
        "MiniMaxAI/MiniMax-Text-01-hf", "MiniMax-01", "456B-A46B", stated("456B", MINIMAX_CARD, MINIMAX_NOTE)
    ),
    Model(
        "moonshotai/Kimi-Linear-48B-A3B-Instruct",
        "Kimi Linear",
        "48B-A3B",
        label("48B", KIMI_LINEAR_CARD, KIMI_LINEAR_NOTE),
    ),
)
