"""The two records behind every weight format: :class:`WeightFormat`, what a user picks by id, and
``_Scheme``, how :func:`~gpumem_gui.core.formats.accounting.weight_bytes` sizes its tensors.

Both are plain data shared by the format lists (:mod:`.hf_quant`, :mod:`.gguf_types`), the registry and the
byte accounting; this module holds no rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from gpumem_gui.core.spec.model import Frozen

Family = Literal["float", "fp8", "bitsandbytes", "gptq", "awq", "microscaling", "gguf", "gguf-mix"]


class WeightFormat(Frozen):
    """One way of storing a model's weights.

    ``bits`` is the storage cost of one quantized weight of a large matrix, its block scales, zero-points
    and shared exponents included (nf4: 4 + 32/64 = 4.5; Q4_K: 144 B / 256 = 4.5). For a llama.cpp mix it
    is that of the mix's default tensor type; the mix itself costs more (see :func:`weight_bytes`).
    """

    id: str = Field(min_length=1)
    label: str
    description: str
    family: Family
    bits: float = Field(gt=0)
    source: str


# (storage label, bytes) of each part a tensor is stored as: packed weights, scales, zero-points, indices
Parts = tuple[tuple[str, int], ...]

_SRC_FLOAT = "definition: IEEE fp32 4 B, fp16/bf16 2 B per parameter"

# GPTQ/AWQ defaults: group size 128 (AutoGPTQ BaseQuantizeConfig / AutoAWQ quant_config "q_group_size").
_GROUP = 128


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class _Scheme:
    """How an HF-side format sizes tensors (GGUF formats are sized by :func:`gguf_plan`)."""

    kind: str
    float_bytes: int = 0
    bits: int = 0
    group: int = _GROUP
    double_quant: bool = False
    experts_only: bool = False
    outside_linears: bool = False  # also quantizes nn.Linear outside the decoder layers (project_in/out)
    ggml_type: str = ""
    ftype: str = ""
