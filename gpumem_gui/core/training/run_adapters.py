"""The LoRA / QLoRA fields of :class:`~gpumem_gui.core.training.run.TrainingRun`, declared once (type, range,
UI); kept apart so the run model stays one readable list."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from gpumem_gui.core.errors import short
from gpumem_gui.core.fields import UI
from gpumem_gui.core.replay.adapters import REGEX
from gpumem_gui.core.replay.vision_train import TOWER_TARGETS, adapts_tower

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

# Whether the LoRA targets reach a vision-language model's vision tower and projector
# (replay/vision_train.py tower_linears). PEFT 0.21 resolves target_modules over the whole model: all-linear
# is every nn.Linear / Conv1D but the output embedding (peft/tuners/tuners_utils.py
# _maybe_include_all_linear_layers), a name matches wherever it ends a module's path
# (check_target_module_exists); TRL's VLM SFT examples pass all-linear. LLaMA-Factory
# (model/model_utils/misc.py find_all_linear_modules, model/model_utils/visual.py patch_target_modules)
# always leaves a composite model's projector out of all-linear and leaves the tower out too while
# freeze_vision_tower holds (its default). Axolotl's lora_target_linear (src/axolotl/loaders/adapter.py
# find_all_linear_names: the last name of every Linear, the tower's included) is targets. unsloth's
# FastVisionModel.get_peft_model (finetune_vision_layers=True by default; unsloth_zoo peft_utils.py
# get_peft_regex: linears under vision-tagged modules whose path names attention or an MLP) adapts the tower
# and, by those tags, some projectors (Qwen2.5-VL's merger.mlp) but not others: tower is the nearest value.
LoraVisionTower = Annotated[
    Literal[TOWER_TARGETS],
    UI(
        "Vision tower adapters",
        _L,
        "whether the LoRA targets reach the vision tower: targets resolves them over the whole model as "
        "PEFT's get_peft_model does (all-linear adapts the tower's and projector's linears; TRL), tower "
        "adapts the tower but not the projector (LLaMA-Factory freeze_vision_tower: false), excluded leaves "
        "both without adapters (LLaMA-Factory's default freeze_vision_tower: true); the adapted tower runs "
        "under autograd on the step's images",
        choices=(
            ("tower and projector (PEFT, TRL)", "targets"),
            ("tower only (LLaMA-Factory unfrozen)", "tower"),
            ("excluded (LLaMA-Factory default)", "excluded"),
        ),
        shown=_adapters,
        model=adapts_tower,
    ),
]

# the bitsandbytes formats of a quantized base (formats/hf_quant.py ids): Linear4bit's, then Linear8bitLt's
QLORA_BASES = ("nf4", "nf4-dq", "int8")


def _bnb_base(v: str) -> str:
    if v not in QLORA_BASES:
        raise ValueError(f"QLoRA needs a bitsandbytes base: {', '.join(QLORA_BASES)}, got {v!r}")
    return v


QloraBase = Annotated[
    str,
    AfterValidator(_bnb_base),
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

# How a 4-bit base stores an MoE's routed experts. bf16 is transformers >= 5 with bitsandbytes: the experts
# are fused 3-D nn.Parameter stacks, which replace_with_bnb_linear (integrations/bitsandbytes.py) leaves
# alone as it replaces nn.Linear modules only. 4bit is Axolotl's quantize_moe_experts (its moe_quant module:
# bitsandbytes.nn.parametrize replace_parameter_4bit on every 3-D expert parameter, dequantized whole when
# the experts read it). 4bit-linear is transformers < 5 (v4.57 models/mixtral/modeling_mixtral.py
# MixtralSparseMoeBlock: a ModuleList of expert MLPs, each nn.Linear a Linear4bit): the same 4-bit weights,
# dequantized one expert projection at a time, LoRA on each expert's linears (replay/moe_per_expert.py).
QloraExperts = Annotated[
    Literal["bf16", "4bit", "4bit-linear"],
    UI(
        "QLoRA experts",
        _L,
        "how a 4-bit base stores an MoE's routed experts: bf16 as transformers >= 5 loads them (fused 3-D "
        "expert stacks are no nn.Linear, bitsandbytes skips them), or 4bit as Axolotl's "
        "quantize_moe_experts: true stores them (each MoE layer's stacks dequantized whole when read), or "
        "4bit-linear as transformers < 5 builds them (one Linear4bit per expert projection, looped over)",
        choices=(
            ("bf16 (transformers >= 5)", "bf16"),
            ("4-bit (quantize_moe_experts)", "4bit"),
            ("4-bit Linear4bit per expert (transformers < 5)", "4bit-linear"),
        ),
        shown=lambda v: v.get("method") == "qlora" and v.get("qlora_base", "nf4") != "int8",
    ),
]


# a module name or a dotted end of a module's path (PEFT check_target_module_exists: key.endswith("." + name))
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.\w+)*")
# a repeated group with a repeat inside ((a+)+): exponential backtracking, a hang rather than an answer
_NESTED_REPEAT = re.compile(r"\([^()]*[*+}][^()]*\)[*+{]")


def parse_lora_targets(v: object) -> object:
    """``lora_targets`` as written: ``all-linear``; module names or dotted ends of module paths, comma
    separated or a list; or ``re:`` and one regex over the whole path (a list holding only that, too)."""
    if isinstance(v, list | tuple) and len(v) == 1 and isinstance(v[0], str) and v[0].startswith(REGEX):
        v = v[0]
    if isinstance(v, str) and v.startswith(REGEX):
        try:
            re.compile(v[len(REGEX) :])
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"{short(v)} is not a regular expression ({short(str(e), 60)})") from None
        if _NESTED_REPEAT.search(v):
            raise ValueError(f"{short(v)}: a repeated group that repeats inside is not accepted")
        return (v,)
    if isinstance(v, str) and v != "all-linear":
        v = tuple(x.strip() for x in v.split(",") if x.strip())
    if isinstance(v, list | tuple):
        if not v:
            raise ValueError("name at least one module (q_proj, k_proj, ...) or 'all-linear'")
        for name in v:
            if not isinstance(name, str) or not _DOTTED.fullmatch(name):
                raise ValueError(
                    f"{short(name)} is not a module name: give the last part of a module's path (q_proj, "
                    "query_key_value, c_attn, lm_head) or a dotted end of it (self_attn.q_proj), comma "
                    "separated; 're:' and a regex over the whole path (re:.*\\.(q|v)_proj); or 'all-linear'"
                )
        return tuple(v)
    return v
