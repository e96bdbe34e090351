"""The LoRA / QLoRA fields of :class:`~gpumem_gui.core.training.run.TrainingRun`, declared once (type, range,
UI); kept apart so the run model stays one readable list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from gpumem_gui.core.fields import UI

_L = "LoRA"


def _adapters(v: Mapping[str, Any]) -> bool:
    return v.get("method") in ("lora", "qlora")


LoraRank = Annotated[
    int,
    Field(ge=1, le=1 << 16),
    UI("Rank", _L, "LoRA rank r: at most the smallest dimension of a targeted layer", shown=_adapters),
]

LoraAlpha = Annotated[
    float,
    Field(gt=0, le=1 << 20),
    UI("Alpha", _L, "lora_alpha (scaling only): no effect on memory", shown=_adapters),
]

LoraTargets = Annotated[
    Literal["all-linear"] | tuple[str, ...],
    UI(
        "Target modules",
        _L,
        "module names that get adapters, comma separated (q_proj,v_proj; fused projections by their own "
        "name: query_key_value, qkv_proj, c_attn; or a dotted end of a path: self_attn.q_proj), 're:' and "
        "a regex PEFT fullmatches against each module's path (re:.*layers\\.[0-7]\\..*_proj; paths as "
        "model.layers.N.self_attn.q_proj), or all-linear (every linear layer of the decoder but the head, as "
        "PEFT resolves it); lm_head adapts the head too, gate a MoE router (PEFT's ParamWrapper)",
        choices=(
            ("all-linear", "all-linear"),
            ("q_proj,v_proj", "q_proj,v_proj"),
            ("q_proj,k_proj,v_proj,o_proj", "q_proj,k_proj,v_proj,o_proj"),
        ),
        values="all-linear, module names or dotted path ends, comma separated, or re:<regex>",
        shown=_adapters,
    ),
]

LoraDropout = Annotated[
    float,
    Field(ge=0, lt=1),
    UI(
        "LoRA dropout",
        _L,
        "above 0 each adapter keeps a dropped copy of its input for backward",
        step=0.05,
        shown=_adapters,
    ),
]

# the bitsandbytes formats of a quantized base (formats/hf_quant.py ids): Linear4bit's, then Linear8bitLt's
QLORA_BASES = ("nf4", "nf4-dq", "int8")
QloraBase = Annotated[
    str,
    UI(
        "QLoRA base",
        _L,
        "bitsandbytes format of the frozen base: nf4 (load_in_4bit), nf4-dq with double quantization "
        "(bnb_4bit_use_double_quant: quantized absmax, ~0.4 bit/param less), or int8 (load_in_8bit, "
        "LLM.int8: int8 weights + an fp32 scale per row, Linear8bitLt)",
        choices=(("nf4", "nf4"), ("nf4 + double quantization", "nf4-dq"), ("int8 (LLM.int8)", "int8")),
        shown=lambda v: v.get("method") == "qlora",
    ),
]
