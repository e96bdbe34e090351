"""GGUF storage types: ggml's tensor types with their block sizes, llama.cpp's file types (the
``llama-quantize`` mixes) with the type each starts from, and the GGUF entries of the format list.

``_gguf_formats`` yields one format per mix (``gguf-Q4_K_M``) and one per ggml type stored in every
quantizable tensor (``gguf-Q4_K``, ``gguf-Q4_0-pure`` where a mix has the same name); which type a mix gives
each tensor is decided in :mod:`.gguf_mix`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from gpumem_gui.core.formats.scheme import WeightFormat, _Scheme

if TYPE_CHECKING:
    from gguf import LlamaFileType

_SRC_GGUF = (
    "llama.cpp src/llama-quant.cpp llama_tensor_get_type / llama_tensor_get_type_impl / "
    "tensor_type_fallback / tensor_allows_quantization / llama_ftype_get_default_type (ggml-org/llama.cpp "
    "@007dbbf); convert_hf_to_gguf.py prepare_tensors (1-D tensors, *_norm, ffn_gate_inp, position_embd and "
    "biases written as F32); ggml block sizes from gguf-py GGML_QUANT_SIZES"
)

# gguf-py (and numpy, which it imports) loads in ~0.1 s: imported the first time a GGUF table is needed,
# not when the core is (the window's first paint waits for the core; issue 18)


@functools.cache
def _quant_sizes() -> dict:
    """gguf-py's GGML_QUANT_SIZES: ggml type -> (block size, bytes per block)."""
    from gguf import GGML_QUANT_SIZES

    return dict(GGML_QUANT_SIZES)


class _LazyBlocks(Mapping[str, tuple[int, int]]):
    """ggml (block size, bytes per block) by type name (gguf-py GGML_QUANT_SIZES), read on first use."""

    @functools.cached_property
    def _table(self) -> dict[str, tuple[int, int]]:
        return {t.name: bs for t, bs in _quant_sizes().items()}

    def __getitem__(self, name: str) -> tuple[int, int]:
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


_GGML_BLOCKS = _LazyBlocks()


# ggml float types (not block-quantized: ggml_is_quantized is false for them).
_GGML_FLOATS = frozenset({"F32", "F16", "BF16"})
# Block types ggml uses only as the other operand of a dot product (type_traits vec_dot_type); llama-quantize
# has no file type for them and never stores weights in them.
_GGML_DOT_ONLY = frozenset({"Q8_1", "Q8_K"})
# Integer and f64 types hold no weights.
_GGML_NOT_WEIGHTS = frozenset({"I8", "I16", "I32", "I64", "F64"})

# llama_ftype_get_default_type (src/llama-quant.cpp): the tensor type each file type starts from.
_FTYPE_DEFAULT = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q1_0": "Q1_0",
    "MXFP4_MOE": "MXFP4",
    "NVFP4": "NVFP4",
    "Q2_K_S": "Q2_K",
    "Q2_K": "Q2_K",
    "IQ3_XS": "IQ3_S",
    "Q3_K_S": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
    "TQ1_0": "TQ1_0",
    "TQ2_0": "TQ2_0",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_XS",
    "IQ2_M": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "IQ3_S": "IQ3_S",
    "IQ3_M": "IQ3_S",
}

# What the common mixes do beyond their default type (a summary of llama_tensor_get_type_impl for dense
# models; MoE, Falcon and 70B models get a few more overrides, all applied by gguf_plan).
_MIX_NOTES = {
    "Q2_K": "attn_v Q4_K (GQA >= 4) or Q3_K, ffn_down and attn_output Q3_K, output Q6_K",
    "Q3_K_S": "output Q6_K, everything else Q3_K",
    "Q3_K_M": "attn_v Q5_K in the first 2 layers then Q4_K, ffn_down Q5_K (first 1/16) or Q4_K, attn_output "
    "Q4_K, output Q6_K",
    "Q3_K_L": "attn_v, ffn_down and attn_output Q5_K, output Q6_K",
    "Q4_K_S": "attn_v Q5_K in the first 4 layers, ffn_down Q5_K in the first 1/8 of layers, output Q6_K",
    "Q4_K_M": "attn_v and ffn_down Q6_K in the first and last 1/8 of layers and every third layer between "
    "(use_more_bits), output Q6_K",
    "Q5_K_S": "output Q6_K, everything else Q5_K",
    "Q5_K_M": "attn_v and ffn_down Q6_K where use_more_bits, output Q6_K",
    "Q6_K": "all Q6_K",
    "Q8_0": "all Q8_0",
    "Q4_0": "output Q6_K, everything else Q4_0",
    "IQ4_XS": "attn_v Q5_K (GQA >= 4), ffn_down Q5_K in the first 1/8 of layers, output Q6_K",
    "F16": "2-D tensors F16",
    "BF16": "2-D tensors BF16",
    "F32": "everything F32",
}


def _ggml_bpw(type_name: str) -> float:
    block, size = _GGML_BLOCKS[type_name]
    return size * 8 / block


def _ftype_name(ft: LlamaFileType) -> str:
    return "F32" if ft.name == "ALL_F32" else ft.name.removeprefix("MOSTLY_")


def _gguf_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
    from gguf import LlamaFileType

    GGML_QUANT_SIZES = _quant_sizes()
    types = {t.name for t in GGML_QUANT_SIZES}
    mixes: list[str] = []
    for ft in LlamaFileType:
        name = _ftype_name(ft)
        default = _FTYPE_DEFAULT.get(name)
        if default is None or default not in types:
            continue  # GUESSED and file types llama.cpp no longer writes
        mixes.append(name)
        note = _MIX_NOTES.get(name, f"default {default}, with the per-tensor overrides of llama-quantize")
        yield (
            WeightFormat(
                id=f"gguf-{name}",
                label=f"GGUF {name}",
                description=f"llama-quantize {name}: {note}; 1-D tensors and routers F32",
                family="gguf-mix",
                bits=_ggml_bpw(default),
                source=_SRC_GGUF,
            ),
            _Scheme("gguf", ggml_type=default, ftype=name),
        )
    for t in sorted(GGML_QUANT_SIZES, key=lambda t: t.value):
        if t.name in _GGML_FLOATS | _GGML_DOT_ONLY | _GGML_NOT_WEIGHTS:
            continue
        block, size = GGML_QUANT_SIZES[t]
        fid = f"gguf-{t.name}-pure" if t.name in mixes else f"gguf-{t.name}"
        yield (
            WeightFormat(
                id=fid,
                label=f"GGUF {t.name} (every tensor)",
                description=f"every quantizable tensor in {t.name} ({size} B per {block} weights), as "
                "llama-quantize --pure writes it; 1-D tensors and routers F32",
                family="gguf",
                bits=size * 8 / block,
                source=_SRC_GGUF,
            ),
            _Scheme("gguf", ggml_type=t.name, ftype=""),
        )


def _block_size(type_name: str) -> int:
    return _GGML_BLOCKS[type_name][0]


def _gguf_type_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    block, size = _GGML_BLOCKS[type_name]
    ne0 = shape[-1] if shape else 1
    numel = 1
    for d in shape:
        numel *= d
    rows = numel // ne0 if ne0 else 0
    return rows * (ne0 // block) * size
