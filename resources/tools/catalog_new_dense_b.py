"""Catalog entries of the model types issue 14 adds, group dense_b: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count.

"Hub model size" figures are what the model's Hugging Face page shows as its size (read from the
safetensors metadata of the published checkpoint), rounded as shown there."""

from __future__ import annotations

from catalog_published import Model, Published, label, stated

_HUB = "https://huggingface.co/{id} (Hub 'Model size', from the checkpoint's safetensors)"
_NAME = "https://huggingface.co/{id} (model name)"


def _hub(model_id: str, figure: str) -> Published:
    return stated(figure, _HUB.format(id=model_id))


def _name(model_id: str, figure: str, note: str = "") -> Published:
    return label(figure, _NAME.format(id=model_id), note)


MODELS: tuple[Model, ...] = (
    Model("THUDM/GLM-4-9B-0414", "GLM-4", "9B", _name("THUDM/GLM-4-9B-0414", "9B")),
    Model("THUDM/GLM-4-32B-0414", "GLM-4", "32B", _name("THUDM/GLM-4-32B-0414", "32B")),
    Model("THUDM/glm-4-9b-chat-hf", "GLM-4", "9B", _name("THUDM/glm-4-9b-chat-hf", "9B")),
    Model(
        "internlm/internlm3-8b-instruct", "InternLM3", "8B", _hub("internlm/internlm3-8b-instruct", "8.8B")
    ),
    Model(
        "ByteDance-Seed/Seed-OSS-36B-Instruct",
        "Seed-OSS",
        "36B",
        _name("ByteDance-Seed/Seed-OSS-36B-Instruct", "36B"),
    ),
    Model("tencent/Hunyuan-7B-Instruct", "Hunyuan", "7B", _hub("tencent/Hunyuan-7B-Instruct", "7.5B")),
    Model(
        "baidu/ERNIE-4.5-0.3B-PT",
        "ERNIE 4.5",
        "0.3B",
        stated("0.36B", "https://huggingface.co/baidu/ERNIE-4.5-0.3B-PT (model card, 'Model Overview')"),
    ),
    Model(
        "mistralai/Ministral-8B-Instruct-2410",
        "Ministral",
        "8B",
        _hub("mistralai/Ministral-8B-Instruct-2410", "8.02B"),
    ),
    Model(
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "Mistral Small 3.1",
        "24B",
        _name(
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
            "24B",
            "transformers 5.24 ties lm_head to the text embedding for this config (Mistral3Config."
            "tie_word_embeddings defaults to True and the file sets none): 23.34B as built, 24.01B untied",
        ),
    ),
    Model("bigcode/starcoderbase-1b", "StarCoder", "1B", _hub("bigcode/starcoderbase-1b", "1.14B")),
    Model("bigcode/starcoderbase-3b", "StarCoder", "3B", _name("bigcode/starcoderbase-3b", "3B")),
    Model("bigcode/starcoderbase-7b", "StarCoder", "7B", _name("bigcode/starcoderbase-7b", "7B")),
    Model(
        "bigcode/starcoder",
        "StarCoder",
        "15.5B",
        stated("15.5B", "https://huggingface.co/bigcode/starcoder (model card: '15.5B parameter models')"),
    ),
)
