"""Ollama model names (``llama3.1:8b-instruct-q4_K_M``) mapped to the model gpumem sizes and its GGUF type.

An Ollama name is ``family[:tag]``; the tag is ``size[-variant...][-quantization]`` (``latest`` or no tag: the
family's default size). Without a quantization, the library's default tag's type applies: Q4_K_M for most
families, Q4_0 for the older ones, Q8_0 for llama3.2:1b, MXFP4 for gpt-oss. Each family names the
ollama.com/library page its sizes and default types come from (the size shown for the default tag there
matches params x the type's bits). ``hf`` is the Hugging Face model whose config has the GGUF's shapes (a
distill names the base it shares its shapes with).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpumem_gui.core.errors import GpumemInputError


@dataclass(frozen=True)
class OllamaFamily:
    default: str  # the size ``latest`` means
    sizes: dict[str, str]  # size tag -> Hugging Face model id
    quant: str  # the default tag's GGUF type
    source: str
    quant_by_size: tuple[tuple[str, str], ...] = ()  # sizes whose default type differs
    note: str = ""


def _lib(name: str) -> str:
    return f"https://ollama.com/library/{name}"


_L31, _L3, _L2 = "meta-llama/Llama-3.1-", "meta-llama/Meta-Llama-3-", "meta-llama/Llama-2-"
_Q25, _Q3, _G3, _G2 = "Qwen/Qwen2.5-", "Qwen/Qwen3-", "google/gemma-3-", "google/gemma-2-"

OLLAMA_FAMILIES: dict[str, OllamaFamily] = {
    "llama3.1": OllamaFamily(
        "8b",
        {"8b": _L31 + "8B", "70b": _L31 + "70B-Instruct", "405b": _L31 + "405B"},
        "Q4_K_M",
        _lib("llama3.1"),
        note="instruct and base share their shapes",
    ),
    "llama3.2": OllamaFamily(
        "3b",
        {"1b": "meta-llama/Llama-3.2-1B", "3b": "meta-llama/Llama-3.2-3B"},
        "Q4_K_M",
        _lib("llama3.2"),
        quant_by_size=(("1b", "Q8_0"),),  # llama3.2:1b is 1b-instruct-q8_0 (1.3 GB)
    ),
    "llama3.3": OllamaFamily("70b", {"70b": "meta-llama/Llama-3.3-70B-Instruct"}, "Q4_K_M", _lib("llama3.3")),
    "llama3": OllamaFamily("8b", {"8b": _L3 + "8B", "70b": _L3 + "70B"}, "Q4_0", _lib("llama3")),
    "llama2": OllamaFamily(
        "7b", {"7b": _L2 + "7b-hf", "13b": _L2 + "13b-hf", "70b": _L2 + "70b-hf"}, "Q4_0", _lib("llama2")
    ),
    "qwen2.5": OllamaFamily(
        "7b",
        {s: f"{_Q25}{s.upper()}" for s in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")},
        "Q4_K_M",
        _lib("qwen2.5"),
    ),
    "qwen3": OllamaFamily(
        "8b",
        {
            **{s: f"{_Q3}{s.upper()}" for s in ("0.6b", "1.7b", "4b", "8b", "14b", "32b")},
            "30b": _Q3 + "30B-A3B",
            "235b": _Q3 + "235B-A22B-Instruct-2507",
        },
        "Q4_K_M",
        _lib("qwen3"),
        note="qwen3:235b shares the shapes of Qwen3-235B-A22B-Instruct-2507",
    ),
    "gemma3": OllamaFamily(
        "4b",
        {"1b": _G3 + "1b-it", "4b": _G3 + "4b-it", "12b": _G3 + "12b-it", "27b": _G3 + "27b-it"},
        "Q4_K_M",
        _lib("gemma3"),
    ),
    "gemma2": OllamaFamily(
        "9b", {"2b": _G2 + "2b", "9b": _G2 + "9b", "27b": _G2 + "27b"}, "Q4_0", _lib("gemma2")
    ),
    "mistral": OllamaFamily("7b", {"7b": "mistralai/Mistral-7B-Instruct-v0.3"}, "Q4_K_M", _lib("mistral")),
    "mistral-nemo": OllamaFamily(
        "12b", {"12b": "mistralai/Mistral-Nemo-Base-2407"}, "Q4_0", _lib("mistral-nemo")
    ),
    "mixtral": OllamaFamily(
        "8x7b",
        {"8x7b": "mistralai/Mixtral-8x7B-v0.1", "8x22b": "mistralai/Mixtral-8x22B-v0.1"},
        "Q4_0",
        _lib("mixtral"),
    ),
    "phi3": OllamaFamily(
        "3.8b",
        {
            "3.8b": "microsoft/Phi-3-mini-4k-instruct",
            "mini": "microsoft/Phi-3-mini-4k-instruct",
            "14b": "microsoft/Phi-3-medium-4k-instruct",
            "medium": "microsoft/Phi-3-medium-4k-instruct",
        },
        "Q4_0",
        _lib("phi3"),
    ),
    "phi4": OllamaFamily("14b", {"14b": "microsoft/phi-4"}, "Q4_K_M", _lib("phi4")),
    "deepseek-r1": OllamaFamily(
        "8b",
        {
            "7b": _Q25 + "7B",
            "8b": _Q3 + "8B",
            "14b": _Q25 + "14B",
            "32b": _Q25 + "32B",
            "70b": "meta-llama/Llama-3.3-70B-Instruct",
            "671b": "deepseek-ai/DeepSeek-V3",
        },
        "Q4_K_M",
        _lib("deepseek-r1"),
        note="the distills share their base's shapes: 7b/14b/32b DeepSeek-R1-Distill-Qwen (Qwen2.5), 8b "
        "DeepSeek-R1-0528-Qwen3-8B (before May 2025: Distill-Llama-8B), 70b Distill-Llama-70B (Llama 3.3)",
    ),
    "gpt-oss": OllamaFamily(
        "20b", {"20b": "openai/gpt-oss-20b", "120b": "openai/gpt-oss-120b"}, "MXFP4_MOE", _lib("gpt-oss")
    ),
}

# a tag's last part that names a GGUF type: q4_K_M, q8_0, fp16, f16, bf16, iq4_xs, mxfp4
_QUANT = re.compile(r"^(?:i?q\d[a-z0-9_]*|fp16|f16|bf16|fp32|f32|mxfp4)$", re.IGNORECASE)
_SIZE = re.compile(r"^(?:\d+x)?\d+(?:\.\d+)?[bm]$", re.IGNORECASE)  # 8b, 0.5b, 8x7b, 135m
_QUANT_ALIASES = {
    "fp16": "F16",
    "f16": "F16",
    "bf16": "BF16",
    "fp32": "F32",
    "f32": "F32",
    "mxfp4": "MXFP4_MOE",
}


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as given
    family: str
    size: str
    hf: str  # the Hugging Face model with the GGUF's shapes
    weights: str  # gpumem's weight format id (gguf-...)
    quant_given: bool  # the tag named its quantization
    variant: str  # the tag's other parts (instruct, text, v0.3, ...), not needed to size it
    source: str


def _known() -> str:
    return ", ".join(f"{k} ({'/'.join(f.sizes)})" for k, f in OLLAMA_FAMILIES.items())


def gguf_weights_id(quant: str) -> str:
    """gpumem's weight format id of a GGUF type as a tag writes it (``q4_K_M``, ``fp16``, ``mxfp4``)."""
    from gpumem_gui.core.formats import list_weight_formats

    q = _QUANT_ALIASES.get(quant.lower(), quant.upper())
    ids = {
        f.id.lower(): f.id for f in list_weight_formats() if f.id.startswith("gguf-") and "-pure" not in f.id
    }
    fid = ids.get(f"gguf-{q}".lower())
    if fid is None:
        raise GpumemInputError(
            f"unknown GGUF quantization {quant!r}; known: {', '.join(sorted(i[5:] for i in ids.values()))}",
            field="model",
        )
    return fid


def resolve_ollama_model(name: str) -> OllamaModel:
    """The model and GGUF type of an Ollama name; an unknown name is one line naming the known ones."""
    text = name.strip()
    if text.startswith(("registry.ollama.ai/library/", "library/")):
        text = text.split("library/", 1)[1]
    family, _, tag = text.partition(":")
    fam = OLLAMA_FAMILIES.get(family.lower())
    if fam is None:
        raise GpumemInputError(f"unknown Ollama model {name!r}; known: {_known()}", field="model")
    parts = [p for p in tag.split("-") if p] if tag and tag.lower() != "latest" else []
    quant = parts.pop() if parts and _QUANT.match(parts[-1]) else None
    if parts and _SIZE.match(parts[0]) and parts[0].lower() not in fam.sizes:
        raise GpumemInputError(
            f"Ollama model {name!r}: {family} has no size {parts[0]!r}; sizes: {', '.join(fam.sizes)}",
            field="model",
        )
    # a tag of variant words only (``instruct``, ``text-q8_0``) is the default size
    size = parts.pop(0).lower() if parts and parts[0].lower() in fam.sizes else fam.default
    hf = fam.sizes[size]
    default_q = dict(fam.quant_by_size).get(size, fam.quant)
    return OllamaModel(
        name=name,
        family=family.lower(),
        size=size,
        hf=hf,
        weights=gguf_weights_id(quant or default_q),
        quant_given=quant is not None,
        variant="-".join(parts),
        source=fam.source,
    )


def ollama_tag(model: str, weights: str) -> str:
    """The Ollama name of a model and GGUF type: a library tag where the table has one, else Ollama's
    ``hf.co/<repo>:<type>`` form."""
    quant = weights.removeprefix("gguf-")
    for family, fam in OLLAMA_FAMILIES.items():
        for size, hf in fam.sizes.items():
            if hf == model and not size.isalpha():
                default_q = dict(fam.quant_by_size).get(size, fam.quant)
                return f"{family}:{size}" if quant == default_q else f"{family}:{size}-{quant.lower()}"
    return f"hf.co/{model}:{quant}"
