"""Catalog entries of the model types issue 14 adds, group hybrid (linear-attention layers beside attention):
family, size label and the parameter count the publisher states, with its source; build_model_catalog checks
each against the exact count."""

from __future__ import annotations

from catalog_published import Model, stated

# Qwen/Qwen3-Next-80B-A3B-Instruct model card (README.md), 'Model Overview': "Number of Parameters: 80B in
# total and 3B activated"
QWEN3_NEXT_CARD = "Qwen/Qwen3-Next-80B-A3B-Instruct model card, 'Model Overview'"
STATE_NOTE = (
    "Hybrid: 36 gated DeltaNet layers keep a fixed 74.2 MiB state per sequence (bf16 conv + fp32 recurrent) "
    "beside the 12 gated-attention layers' KV cache."
)

# Qwen/Qwen3.5-9B model card, 'Model Overview', Language Model: "Number of Parameters: 9B" (the text model
# that AutoModelForCausalLM builds, Qwen3_5ForCausalLM; the vision encoder is not counted)
QWEN3_5_9B_CARD = "Qwen/Qwen3.5-9B model card, 'Model Overview', Language Model"
# Qwen/Qwen3.6-35B-A3B model card, 'Model Overview', Language Model: "Number of Parameters: 35B in total and
# 3B activated"; transformers docs/source/en/model_doc/qwen3_5_moe.md: "Qwen/Qwen3.5-35B-A3B (35B total/3B
# active)"
QWEN3_6_CARD = "Qwen/Qwen3.6-35B-A3B model card, 'Model Overview', Language Model"
QWEN3_5_MOE_DOC = (
    "transformers docs/source/en/model_doc/qwen3_5_moe.md, 'Qwen/Qwen3.5-35B-A3B (35B total/3B active)'"
)
TEXT_NOTE = (
    "Text model as AutoModelForCausalLM loads it (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM: the vision "
    "encoder's weights are skipped); the linear-attention layers keep a fixed state per sequence."
)

# LiquidAI/LFM2-350M model card, 'Model details': "Parameters | 354,483,968 | 742,489,344 | 1,170,340,608 |
# 2,569,272,320" (LFM2-350M, -700M, -1.2B, -2.6B)
LFM2_CARD = "LiquidAI/LFM2-350M model card, 'Model details' (exact figures, stated here to 1,000 parameters)"
LFM2_NOTE = "Hybrid: 10 gated short-convolution layers (a conv state per sequence) and 6 attention layers."

MODELS: tuple[Model, ...] = (
    Model(
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "Qwen3-Next",
        "80B-A3B",
        stated("80B", QWEN3_NEXT_CARD, STATE_NOTE),
    ),
    Model("Qwen/Qwen3.5-9B", "Qwen3.5", "9B", stated("9B", QWEN3_5_9B_CARD, TEXT_NOTE)),
    Model("Qwen/Qwen3.5-35B-A3B", "Qwen3.5", "35B-A3B", stated("35B", QWEN3_5_MOE_DOC, TEXT_NOTE)),
    Model("Qwen/Qwen3.6-35B-A3B", "Qwen3.6", "35B-A3B", stated("35B", QWEN3_6_CARD, TEXT_NOTE)),
    Model("LiquidAI/LFM2-350M", "LFM2", "350M", stated("354.484M", LFM2_CARD, LFM2_NOTE)),
    Model("LiquidAI/LFM2-700M", "LFM2", "700M", stated("742.489M", LFM2_CARD, LFM2_NOTE)),
    Model("LiquidAI/LFM2-1.2B", "LFM2", "1.2B", stated("1170.341M", LFM2_CARD, LFM2_NOTE)),
)
