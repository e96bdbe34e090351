"""Tiny safetensors files (headers laid out by hand) for the reader's tests (tests/test_safetensors_*.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# Bytes per element, written out here independently of the reader's table (safetensors tensor.rs
# Dtype::bitsize / 8); F4 is two elements per byte.
ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I8": 1, "U8": 1, "F8_E4M3": 1, "F64": 8, "I64": 8}

Spec = dict[str, tuple[str, list[int]]]


def nbytes(dtype: str, shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    if dtype == "F4":
        return n // 2
    return n * ITEM_BYTES[dtype]


def header_json(tensors: Spec, metadata: dict[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """The header object for ``tensors`` laid out back to back (in the given order), and the data size."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    pos = 0
    for name, (dtype, shape) in tensors.items():
        n = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return header, pos


def raw_file(header: object, data_size: int, *, pad: bool = True) -> bytes:
    text = json.dumps(header).encode()
    if pad:  # the reference writer pads the header with spaces to a multiple of 8
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"\0" * data_size


def write_st(path: Path, tensors: Spec, metadata: dict[str, str] | None = None) -> Path:
    header, size = header_json(tensors, metadata)
    path.write_bytes(raw_file(header, size))
    return path


LLAMA: Spec = {
    "model.embed_tokens.weight": ("BF16", [32, 16]),
    "model.layers.0.input_layernorm.weight": ("F32", [16]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [16, 16]),
    "model.layers.0.self_attn.k_proj.weight": ("BF16", [8, 16]),
    "model.layers.0.self_attn.v_proj.weight": ("BF16", [8, 16]),
    "model.layers.0.self_attn.o_proj.weight": ("BF16", [16, 16]),
    "model.layers.0.post_attention_layernorm.weight": ("F32", [16]),
    "model.layers.0.mlp.gate_proj.weight": ("BF16", [24, 16]),
    "model.layers.0.mlp.up_proj.weight": ("BF16", [24, 16]),
    "model.layers.0.mlp.down_proj.weight": ("BF16", [16, 24]),
    "model.norm.weight": ("F32", [16]),
    "lm_head.weight": ("BF16", [32, 16]),
}


IN, OUT, GROUP = 64, 32, 32  # a q_proj of 64 inputs, 32 outputs; 4-bit, group size 32; int32 packs 8 values


def _base() -> Spec:
    return {
        "model.embed_tokens.weight": ("F16", [16, IN]),
        "model.layers.0.input_layernorm.weight": ("F16", [IN]),
    }


GPTQ: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.qweight": ("I32", [IN // 8, OUT]),
    "model.layers.0.self_attn.q_proj.qzeros": ("I32", [IN // GROUP, OUT // 8]),
    "model.layers.0.self_attn.q_proj.scales": ("F16", [IN // GROUP, OUT]),
    "model.layers.0.self_attn.q_proj.g_idx": ("I32", [IN]),
}
AWQ: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.qweight": ("I32", [IN, OUT // 8]),
    "model.layers.0.self_attn.q_proj.qzeros": ("I32", [IN // GROUP, OUT // 8]),
    "model.layers.0.self_attn.q_proj.scales": ("F16", [IN // GROUP, OUT]),
}
BNB4: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("U8", [IN * OUT // 2, 1]),
    "model.layers.0.self_attn.q_proj.weight.absmax": ("U8", [IN * OUT // 64]),
    "model.layers.0.self_attn.q_proj.weight.nested_absmax": ("F32", [1]),
    "model.layers.0.self_attn.q_proj.weight.nested_quant_map": ("F32", [256]),
    "model.layers.0.self_attn.q_proj.weight.quant_map": ("F32", [16]),
    "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4": ("U8", [120]),
}
BNB8: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("I8", [OUT, IN]),
    "model.layers.0.self_attn.q_proj.SCB": ("F32", [OUT]),
    "model.layers.0.self_attn.q_proj.weight_format": ("U8", []),
}
FP8: Spec = {
    **_base(),
    "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [OUT, IN]),
    "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", [1, 1]),
}
