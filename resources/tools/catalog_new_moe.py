"""Catalog entries of the model types issue 14 adds, group moe: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count."""

from __future__ import annotations

from catalog_published import Model, label, stated

_HF = "https://huggingface.co/{id} ({where})"
# GLM-4.5 / MiniMax-M2 state totals with their multi-token-prediction layers, which the transformers model
# classes do not build (Glm4MoeConfig num_nextn_predict_layers, MiniMax-M2's num_mtp_modules)
_MTP = "the published total includes the MTP layer(s); transformers builds the model without them"
# base / earlier checkpoints of the same model class and dimensions: their config.json is the flagship's
# architecture (resources/configs copies it)
_SAME = "config: the architecture of {flagship} (same model class and dimensions)"


def _src(model_id: str, where: str) -> str:
    return _HF.format(id=model_id, where=where)


MODELS: tuple[Model, ...] = (
    # olmoe
    Model(
        "allenai/OLMoE-1B-7B-0924",
        "OLMoE",
        "1B-7B",
        stated(
            "6.9B",
            "Muennighoff et al. 2024, 'OLMoE: Open Mixture-of-Experts Language Models' (arXiv:2409.02060): "
            "6.9B total, 1.3B active parameters",
        ),
    ),
    Model(
        "allenai/OLMoE-1B-7B-0924-Instruct",
        "OLMoE",
        "1B-7B",
        label(
            "7B",
            _src("allenai/OLMoE-1B-7B-0924-Instruct", "model card: 1B active, 7B total"),
            _SAME.format(flagship="allenai/OLMoE-1B-7B-0924"),
        ),
    ),
    Model(
        "allenai/OLMoE-1B-7B-0125",
        "OLMoE",
        "1B-7B",
        label(
            "7B",
            _src("allenai/OLMoE-1B-7B-0125", "model card: 1B active, 7B total"),
            _SAME.format(flagship="allenai/OLMoE-1B-7B-0924"),
        ),
    ),
    # phimoe
    Model(
        "microsoft/Phi-3.5-MoE-instruct",
        "Phi-3.5-MoE",
        "16x3.8B",
        label("42B", _src("microsoft/Phi-3.5-MoE-instruct", "model card: 42B total, 6.6B active parameters")),
    ),
    # glm4_moe
    Model(
        "zai-org/GLM-4.5",
        "GLM-4.5",
        "355B-A32B",
        label("355B", _src("zai-org/GLM-4.5", "model card: 355B total, 32B active parameters"), _MTP),
    ),
    Model(
        "zai-org/GLM-4.5-Air",
        "GLM-4.5",
        "106B-A12B",
        label("106B", _src("zai-org/GLM-4.5-Air", "model card: 106B total, 12B active parameters"), _MTP),
    ),
    Model(
        "zai-org/GLM-4.5-Base",
        "GLM-4.5",
        "355B-A32B",
        label(
            "355B",
            _src("zai-org/GLM-4.5-Base", "model card: 355B total, 32B active parameters"),
            f"{_MTP}; " + _SAME.format(flagship="zai-org/GLM-4.5"),
        ),
    ),
    Model(
        "zai-org/GLM-4.5-Air-Base",
        "GLM-4.5",
        "106B-A12B",
        label(
            "106B",
            _src("zai-org/GLM-4.5-Air-Base", "model card: 106B total, 12B active parameters"),
            f"{_MTP}; " + _SAME.format(flagship="zai-org/GLM-4.5-Air"),
        ),
    ),
    Model(
        "zai-org/GLM-4.6",
        "GLM-4.6",
        "355B-A32B",
        label("355B", _src("zai-org/GLM-4.6", "model card: 355B total, 32B active parameters"), _MTP),
    ),
    # hunyuan_v1_moe
    Model(
        "tencent/Hunyuan-A13B-Instruct",
        "Hunyuan",
        "A13B (80B)",
        stated("80B", _src("tencent/Hunyuan-A13B-Instruct", "model card: 80 billion total parameters")),
    ),
    Model(
        "tencent/Hunyuan-A13B-Pretrain",
        "Hunyuan",
        "A13B (80B)",
        stated(
            "80B",
            _src("tencent/Hunyuan-A13B-Pretrain", "model card: 80 billion total parameters"),
            _SAME.format(flagship="tencent/Hunyuan-A13B-Instruct"),
        ),
    ),
    # ernie4_5_moe
    Model(
        "baidu/ERNIE-4.5-21B-A3B-PT",
        "ERNIE 4.5",
        "21B-A3B",
        label("21B", _src("baidu/ERNIE-4.5-21B-A3B-PT", "model card: 21B total parameters, 3B activated")),
    ),
    Model(
        "baidu/ERNIE-4.5-21B-A3B-Base-PT",
        "ERNIE 4.5",
        "21B-A3B",
        label(
            "21B",
            _src("baidu/ERNIE-4.5-21B-A3B-Base-PT", "model card: 21B total parameters, 3B activated"),
            _SAME.format(flagship="baidu/ERNIE-4.5-21B-A3B-PT"),
        ),
    ),
    # dots1
    Model(
        "rednote-hilab/dots.llm1.inst",
        "dots.llm1",
        "142B-A14B",
        stated("142B", _src("rednote-hilab/dots.llm1.inst", "model card: 142B total, 14B activated")),
    ),
    Model(
        "rednote-hilab/dots.llm1.base",
        "dots.llm1",
        "142B-A14B",
        stated(
            "142B",
            _src("rednote-hilab/dots.llm1.base", "model card: 142B total, 14B activated"),
            _SAME.format(flagship="rednote-hilab/dots.llm1.inst"),
        ),
    ),
    # minimax_m2
    Model(
        "MiniMaxAI/MiniMax-M2",
        "MiniMax-M2",
        "230B-A10B",
        label("230B", _src("MiniMaxAI/MiniMax-M2", "model card: 230B total, 10B active parameters"), _MTP),
    ),
)
