"""Catalog entries of the model types issue 14 adds, group dense_a: family, size label and the parameter
count the publisher states, with its source; build_model_catalog checks each against the exact count."""

from __future__ import annotations

from catalog_published import Model, label, stated

_HF = "https://huggingface.co/{id} ({where})"


def _src(model_id: str, where: str) -> str:
    return _HF.format(id=model_id, where=where)


MODELS: tuple[Model, ...] = (
    # smollm3
    Model(
        "HuggingFaceTB/SmolLM3-3B",
        "SmolLM3",
        "3B",
        label("3B", _src("HuggingFaceTB/SmolLM3-3B", "model card: 'a 3B parameter language model'")),
    ),
    Model(
        "HuggingFaceTB/SmolLM3-3B-Base",
        "SmolLM3",
        "3B",
        label("3B", _src("HuggingFaceTB/SmolLM3-3B-Base", "model card: 'a 3B parameter language model'")),
    ),
    # olmo3
    Model(
        "allenai/Olmo-3-1025-7B",
        "OLMo 3",
        "7B",
        label("7B", _src("allenai/Olmo-3-1025-7B", "model card: 'Olmo 3 7B'")),
    ),
    Model(
        "allenai/Olmo-3-1125-32B",
        "OLMo 3",
        "32B",
        label("32B", _src("allenai/Olmo-3-1125-32B", "model card: 'Olmo 3 32B'")),
    ),
    # exaone4
    Model(
        "LGAI-EXAONE/EXAONE-4.0-32B",
        "EXAONE 4.0",
        "32B",
        label("32B", _src("LGAI-EXAONE/EXAONE-4.0-32B", "model card: 'a mid-size 32B model'")),
    ),
    Model(
        "LGAI-EXAONE/EXAONE-4.0-1.2B",
        "EXAONE 4.0",
        "1.2B",
        stated("1.28B", _src("LGAI-EXAONE/EXAONE-4.0-1.2B", "model page, safetensors 'Model size'")),
    ),
    # arcee
    Model(
        "arcee-ai/AFM-4.5B",
        "AFM",
        "4.5B",
        label("4.5B", _src("arcee-ai/AFM-4.5B", "model card: 'a 4.5 billion parameter'")),
    ),
    Model(
        "arcee-ai/AFM-4.5B-Base",
        "AFM",
        "4.5B",
        label("4.5B", _src("arcee-ai/AFM-4.5B-Base", "model card: 'a 4.5 billion parameter'")),
    ),
    # apertus
    Model(
        "swiss-ai/Apertus-8B-2509",
        "Apertus",
        "8B",
        label("8B", _src("swiss-ai/Apertus-8B-2509", "model card: 'a 70B and 8B parameter language model'")),
    ),
    Model(
        "swiss-ai/Apertus-70B-2509",
        "Apertus",
        "70B",
        label(
            "70B", _src("swiss-ai/Apertus-70B-2509", "model card: 'a 70B and 8B parameter language model'")
        ),
    ),
    # cohere2
    Model(
        "CohereLabs/c4ai-command-r7b-12-2024",
        "Command R7B",
        "7B",
        stated("8.03B", _src("CohereLabs/c4ai-command-r7b-12-2024", "model page, safetensors 'Model size'")),
    ),
    Model(
        "CohereLabs/c4ai-command-a-03-2025",
        "Command A",
        "111B",
        label("111B", _src("CohereLabs/c4ai-command-a-03-2025", "model card: '111 billion parameter'")),
    ),
    # gptj
    Model(
        "EleutherAI/gpt-j-6b",
        "GPT-J",
        "6B",
        stated(
            "6.05B",
            _src("EleutherAI/gpt-j-6b", "model card, table: 'n_parameters 6,053,381,344'"),
            note="the card counts the Mesh Transformer JAX checkpoint; transformers' GPTJForCausalLM builds "
            "6,050,882,784",
        ),
    ),
    Model(
        "togethercomputer/GPT-JT-6B-v1",
        "GPT-J",
        "6B",
        label("6B", _src("togethercomputer/GPT-JT-6B-v1", "model card: 'GPT-JT (6B)', a fork of GPT-J-6B")),
    ),
)
