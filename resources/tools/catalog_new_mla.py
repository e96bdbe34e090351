"""Catalog entries of the model types issue 14 adds, group mla (DeepSeek Sparse Attention, MLA variants):
family, size label and the parameter count the publisher states, with its source; build_model_catalog checks
each against the exact count."""

from __future__ import annotations

from catalog_published import LABEL_PRECISION, Model, components, label, stated

MODELS: tuple[Model, ...] = (
    Model(
        "deepseek-ai/DeepSeek-V3.2-Exp",
        "DeepSeek-V3.2",
        "685B-A37B",
        label(
            "685B",
            "https://huggingface.co/docs/transformers/model_doc/deepseek_v32 (overview: 'the same "
            "685B-parameter Mixture-of-Experts (MoE) backbone')",
            note="As DeepSeek-V3's 685B, the figure includes the multi-token-prediction layer, which "
            "transformers does not build (DeepseekV32PreTrainedModel ignores model.layers.61); the main "
            "model with its lightning indexers is 671.88B.",
        ),
    ),
    Model(
        "deepseek-ai/DeepSeek-V4-Flash-Base",
        "DeepSeek-V4",
        "284B-A13B",
        label(
            "284B",
            "https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash-Base (model card: 284B total, 13B "
            "activated, as the SGLang-JAX DeepSeek-V4 RFC quotes it, sgl-project/sglang-jax issue #1678)",
            note="DeepseekV4ForCausalLM as transformers 5.24 builds it: 284,332,230,231 parameters, "
            "35,751,511 of them fp32 (norms, hyper-connections, sinks, compressor position biases; "
            "tests/reference/extra/compressed_cache.json), 13.80B active per token; the checkpoint's MTP "
            "layer is not built.",
        ),
    ),
    Model(
        "moonshotai/Kimi-K2.5",
        "Kimi K2.5",
        "1T-A32B",
        # the card's '1T' is a size label (allowed the label's 6 %): one part of 10^12
        components(
            (1,),
            10**12,
            "https://huggingface.co/moonshotai/Kimi-K2.5 (model card, 'Total Parameters': '1T')",
            note="Kimi_K25ForConditionalGeneration: the DeepSeek-V3-style text model (1026.41B) and the "
            "MoonViT tower and projector (0.47B).",
            precision=LABEL_PRECISION,
        ),
    ),
    Model(
        "mistralai/Mistral-Small-4-119B-2603",
        "Mistral Small 4",
        "119B-A6.5B",
        label(
            "119B",
            "https://huggingface.co/mistralai/Mistral-Small-4-119B-2603 (model name)",
            note="Mistral3ForConditionalGeneration around a Mistral4 text model (MLA, 128 experts top-4): "
            "118.86B as transformers 5.24 builds it (lm_head tied by Mistral3Config's default), 118.97B "
            "untied.",
        ),
    ),
    Model(
        "zai-org/GLM-5",
        "GLM-5",
        "744B-A40B",
        stated(
            "744B",
            "Z.ai 2026, 'GLM-5: from Vibe Coding to Agentic Engineering' (arXiv:2602.15763), architecture "
            "table ('# Total Parameters')",
        ),
    ),
)
