"""Catalog entries of the model types issue 14 adds, group gpt_oss: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count."""

from __future__ import annotations

from catalog_published import Model, stated

# OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv:2508.10925), section 2.1 'Architecture':
# "gpt-oss-120b, which consists of 36 layers (116.8B total parameters), and gpt-oss-20b with 24 layers (20.9B
# total parameters)"; the Hugging Face cards round them to 117B and 21B
GPT_OSS_CARD = "OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv:2508.10925), section 2.1"
MXFP4_NOTE = (
    "The published checkpoint holds the routed experts in MXFP4 (quantization_config quant_method mxfp4: "
    "uint8 blocks of 32 4-bit values and one uint8 E8M0 scale per block); the rest is bf16."
)

MODELS: tuple[Model, ...] = (
    Model("openai/gpt-oss-20b", "gpt-oss", "20B", stated("20.9B", GPT_OSS_CARD, MXFP4_NOTE)),
    Model("openai/gpt-oss-120b", "gpt-oss", "120B", stated("116.8B", GPT_OSS_CARD, MXFP4_NOTE)),
)
