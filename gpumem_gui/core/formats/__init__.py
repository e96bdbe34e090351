"""Weight formats and KV-cache dtypes: what one model costs in bytes in each storage format.

:func:`weight_bytes` walks every parameter tensor of a :class:`~gpumem_gui.core.spec.model.ModelSpec`
(:func:`~gpumem_gui.core.spec.params.text_tensors`) and sizes it the way the runtime that produces or loads
the format stores it: the packed weights, and every scale, zero-point, index and lookup table that goes with
them. Tensors a format does not quantize (embeddings, norms, routers, lm_head, ...) stay at the compute dtype,
except in the plain float formats (everything at that width) and in GGUF (1-D tensors, routers and biases in
F32, as ``convert_hf_to_gguf.py`` writes them). The vision tower and projector of a multimodal spec are never
quantized: they stay at the compute dtype in every format except the plain float ones.

GGUF files are sized tensor by tensor: llama.cpp's ``llama-quantize`` picks a type per tensor
(``src/llama-quant.cpp``, ``llama_tensor_get_type_impl``), e.g. Q4_K_M keeps ``output.weight`` in Q6_K and
half of the ``attn_v``/``ffn_down`` tensors in Q6_K. :func:`gguf_plan` re-derives that choice from the
spec (our own implementation of the rules, reading the function at ggml-org/llama.cpp commit 007dbbf).

The KV-cache part (:data:`KV_DTYPES`, :func:`kv_bytes_per_element`, :func:`check_kv_dtype`) lists the
cache element types each engine accepts and their size per element, block scales included.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from gguf import GGML_QUANT_SIZES, MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, LlamaFileType
from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.results.estimate import Explanation
from gpumem_gui.core.spec.model import Frozen, ModelSpec
from gpumem_gui.core.spec.params import COMPONENTS, Tensor, text_tensors

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


class WeightBytes(Frozen):
    """Bytes of a model's weights in one format, split by component, decoder layer and storage kind.

    ``by_component`` has every component of :data:`~gpumem_gui.core.spec.params.COMPONENTS` (vision included);
    ``per_layer`` the bytes of each decoder layer. ``quantized_params``/``quantized_bytes`` cover the
    tensors the format quantizes, their scales and indices included; ``bits_per_param`` is the average
    over all parameters.
    """

    format: str
    total_bytes: int = Field(ge=0)
    params: int = Field(ge=0)
    quantized_params: int = Field(ge=0)
    quantized_bytes: int = Field(ge=0)
    by_component: dict[str, int]
    per_layer: tuple[int, ...]
    by_storage: dict[str, int]
    bits_per_param: float = Field(ge=0)
    notes: tuple[str, ...] = ()
    explain: Explanation

    @property
    def quantized_bits_per_param(self) -> float:
        """Average bits of the quantized tensors (0 when the format quantizes nothing)."""
        return self.quantized_bytes * 8 / self.quantized_params if self.quantized_params else 0.0


# ---- sources --------------------------------------------------------------------------------------------

_SRC_BNB = (
    "bitsandbytes functional.py quantize_4bit/quantize_blockwise and nn/modules.py Linear8bitLt "
    "(bitsandbytes-foundation/bitsandbytes @95f9af3); QLoRA, arXiv 2305.14314 §3 (double quantization); "
    "transformers integrations/bitsandbytes.py replace_with_bnb_linear/get_keys_to_not_convert"
)
_SRC_GPTQ = (
    "AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py QuantLinear.__init__ (qweight, qzeros, "
    "scales, g_idx buffers); intel/auto-round auto_round/export/formats/base.py _check_divisible_by_32; "
    "vLLM gptq.py GPTQLinearMethod.create_weights (input size must be a multiple of group_size)"
)
_SRC_AWQ = (
    "AutoAWQ awq/modules/linear/gemm.py WQLinear_GEMM.__init__ (qweight [in, out/8], qzeros, scales; "
    "asserts in % group_size == 0); intel/auto-round _check_divisible_by_32"
)
_SRC_FP8 = (
    "vLLM model_executor/layers/quantization/fp8.py Fp8LinearMethod/Fp8MoEMethod (one fp32 weight_scale "
    "per tensor and per expert); compressed-tensors FP8 scheme, llm-compressor recipes ignore lm_head and "
    "the MoE router"
)
_SRC_FP8_BLOCK = (
    "DeepSeek-V3 inference/model.py Linear (weight_scale_inv fp32 [ceil(out/128), ceil(in/128)]); "
    "config.json quantization_config weight_block_size [128, 128]; gate, embedding and head stay bf16"
)
_SRC_MX = (
    "OCP Microscaling Formats (MX) Specification v1.0 (2023), §5: MXFP4 = 32 E2M1 elements + one E8M0 scale; "
    "gpt-oss checkpoints: *_blocks uint8 [E, out, in/32, 16] + *_scales uint8 [E, out, in/32] (experts only)"
)
_SRC_NVFP4 = (
    "NVIDIA TensorRT Model Optimizer NVFP4 checkpoints / vLLM modelopt.py ModelOptNvFp4LinearMethod: weight "
    "uint8 [out, in/2], weight_scale float8_e4m3fn [out, in/16], weight_scale_2 and input_scale fp32 "
    "scalars; in-features must be a multiple of 16; lm_head and routers excluded by default"
)
_SRC_GGUF = (
    "llama.cpp src/llama-quant.cpp llama_tensor_get_type / llama_tensor_get_type_impl / "
    "tensor_type_fallback / tensor_allows_quantization / llama_ftype_get_default_type (ggml-org/llama.cpp "
    "@007dbbf); convert_hf_to_gguf.py prepare_tensors (1-D tensors, *_norm, ffn_gate_inp, position_embd and "
    "biases written as F32); ggml block sizes from gguf-py GGML_QUANT_SIZES"
)
_SRC_FLOAT = "definition: IEEE fp32 4 B, fp16/bf16 2 B per parameter"

_VISION_NOTE = "the vision tower and projector are never quantized: they stay at the compute dtype"


# ---- per-tensor roles -----------------------------------------------------------------------------------


def _role(t: Tensor) -> str:
    """What a parameter tensor is, for deciding whether a format quantizes it."""
    name = t.name
    if t.component == "norms":
        return "norm"
    if name.endswith(".bias") or name.endswith("_bias"):
        return "bias"
    if t.component == "embedding":
        return "token_embd"
    if t.component == "position_embedding":
        return "pos_embd"
    if t.component == "router":
        return "router"
    if t.component == "lm_head":
        return "lm_head"
    if t.component == "embedding_extra":
        return "linear_io"
    if name.endswith("shared_expert_gate.weight"):
        # Linear(hidden, 1) gating the shared expert: vLLM qwen2_moe.py builds it without a quant_config
        return "gate1"
    if len(t.shape) == 3:
        return "experts"
    return "linear"


def _expert_matrices(t: Tensor, gated: bool) -> tuple[int, int, int]:
    """(count, out, in) of the per-expert 2-D matrices a fused expert tensor stands for.

    ``gate_up_proj`` [E, 2F, h] is two matrices per expert (gate_proj, up_proj [F, h]) in every quantized
    checkpoint layout (per-expert nn.Linear before transformers 5; llama.cpp ffn_gate_exps/ffn_up_exps).
    """
    e, rows, cols = t.shape
    if t.name.endswith("gate_up_proj") and gated:
        return 2 * e, rows // 2, cols
    return e, rows, cols


# ---- HF-side formats: sizing one [out, in] matrix -------------------------------------------------------

Parts = tuple[tuple[str, int], ...]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _fp8_matrix(out: int, inp: int) -> Parts:
    return (("fp8 e4m3", out * inp), ("fp32 tensor scales", 4))


# DeepSeek-V3 block size for weight_scale_inv (config.json quantization_config.weight_block_size).
_FP8_BLOCK = 128


def _fp8_block_matrix(out: int, inp: int) -> Parts:
    scales = _ceil(out, _FP8_BLOCK) * _ceil(inp, _FP8_BLOCK)
    return (("fp8 e4m3", out * inp), ("fp32 block scales", 4 * scales))


def _int8_matrix(out: int, inp: int) -> Parts:
    # Linear8bitLt: int8 CB [out, in] + fp32 SCB [out] (bitsandbytes int8_vectorwise_quant row statistics)
    return (("int8", out * inp), ("fp32 row scales (SCB)", 4 * out))


# bitsandbytes 4-bit: quantize_4bit default blocksize 64; double quant re-quantizes the absmax in blocks of
# 256 (quantize_4bit: quantize_blockwise(absmax - offset, blocksize=256)).
_BNB_BLOCK = 64
_BNB_NESTED_BLOCK = 256
# get_4bit_type returns a 16-entry fp32 code per call (per module); the nested state keeps its own copy of
# the 256-entry fp32 dynamic map (quantize_blockwise: code.to(A.device, copy=True)) and a 0-dim fp32 offset.
_BNB_QUANT_MAP_BYTES = 16 * 4
_BNB_NESTED_MAP_BYTES = 256 * 4 + 4


def _bnb4_matrix(out: int, inp: int, double_quant: bool) -> Parts:
    n = out * inp
    blocks = _ceil(n, _BNB_BLOCK)
    packed = ("4-bit packed (uint8)", _ceil(n, 2))
    if not double_quant:
        return (packed, ("fp32 absmax", 4 * blocks), ("fp32 quant_map", _BNB_QUANT_MAP_BYTES))
    return (
        packed,
        ("uint8 absmax", blocks),
        ("fp32 nested absmax", 4 * _ceil(blocks, _BNB_NESTED_BLOCK)),
        ("fp32 quant_map", _BNB_QUANT_MAP_BYTES + _BNB_NESTED_MAP_BYTES),
    )


# GPTQ/AWQ defaults: group size 128 (AutoGPTQ BaseQuantizeConfig / AutoAWQ quant_config "q_group_size").
_GROUP = 128
# int32 packing and the exporters' shape rule: auto-round keeps a Linear at 16 bits when out or in is not a
# multiple of 32 (_check_divisible_by_32); AutoAWQ/vLLM refuse in-features that are not a multiple of the
# group size, so such a module cannot be stored quantized either.
_PACK = 32


def _grouped_ok(out: int, inp: int, group: int) -> bool:
    return out % _PACK == 0 and inp % _PACK == 0 and inp % group == 0


def _gptq_matrix(out: int, inp: int, bits: int, group: int) -> Parts | None:
    if not _grouped_ok(out, inp, group):
        return None
    groups = inp // group
    return (
        ("int32 qweight", inp * bits // 32 * out * 4),
        ("fp16 scales", groups * out * 2),
        ("int32 qzeros", groups * (out * bits // 32) * 4),
        ("int32 g_idx", inp * 4),
    )


def _awq_matrix(out: int, inp: int, group: int) -> Parts | None:
    if not _grouped_ok(out, inp, group):
        return None
    groups = inp // group
    return (
        ("int32 qweight", inp * (out // 8) * 4),
        ("fp16 scales", groups * out * 2),
        ("int32 qzeros", groups * (out // 8) * 4),
    )


# OCP MX v1.0: blocks of 32 elements share one 8-bit E8M0 scale; E2M1 elements are 4 bits (16 B a block).
_MX_BLOCK = 32


def _mxfp4_matrix(out: int, inp: int) -> Parts:
    blocks = out * _ceil(inp, _MX_BLOCK)  # a row shorter than a whole block still stores the whole block
    return (("fp4 e2m1 packed", blocks * _MX_BLOCK // 2), ("e8m0 scales", blocks))


# NVFP4: 16-element blocks with an FP8 E4M3 scale (NVIDIA ModelOpt / TensorRT-LLM NVFP4 layout).
_NVFP4_BLOCK = 16


def _nvfp4_matrix(out: int, inp: int) -> Parts | None:
    if inp % _NVFP4_BLOCK:
        return None  # vLLM ModelOptNvFp4LinearMethod rejects in-features not a multiple of 16
    return (
        ("fp4 e2m1 packed", out * inp // 2),
        ("fp8 e4m3 block scales", out * inp // _NVFP4_BLOCK),
        ("fp32 global scales", 8),  # weight_scale_2 + input_scale
    )


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


def _matrix_parts(s: _Scheme, out: int, inp: int) -> Parts | None:
    if s.kind == "fp8":
        return _fp8_matrix(out, inp)
    if s.kind == "fp8-block":
        return _fp8_block_matrix(out, inp)
    if s.kind == "int8":
        return _int8_matrix(out, inp)
    if s.kind == "bnb4":
        return _bnb4_matrix(out, inp, s.double_quant)
    if s.kind == "gptq":
        return _gptq_matrix(out, inp, s.bits, s.group)
    if s.kind == "awq":
        return _awq_matrix(out, inp, s.group)
    if s.kind == "mxfp4":
        return _mxfp4_matrix(out, inp)
    if s.kind == "nvfp4":
        return _nvfp4_matrix(out, inp)
    raise AssertionError(f"no matrix sizing for scheme kind {s.kind}")


# ---- the registry ---------------------------------------------------------------------------------------


def _hf_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
    yield (
        WeightFormat(
            id="fp32",
            label="FP32",
            description="every parameter in IEEE float32 (4 bytes), the vision tower included",
            family="float",
            bits=32,
            source=_SRC_FLOAT,
        ),
        _Scheme("float", float_bytes=4),
    )
    for fid, label in (("fp16", "FP16"), ("bf16", "BF16")):
        yield (
            WeightFormat(
                id=fid,
                label=label,
                description=f"every parameter in {fid} (2 bytes), the vision tower included",
                family="float",
                bits=16,
                source=_SRC_FLOAT,
            ),
            _Scheme("float", float_bytes=2),
        )
    yield (
        WeightFormat(
            id="fp8",
            label="FP8 (per-tensor)",
            description="decoder linears and experts in fp8 e4m3 with one fp32 scale per tensor (vLLM / "
            "compressed-tensors); embeddings, lm_head, norms and routers stay 16-bit",
            family="fp8",
            bits=8,
            source=_SRC_FP8,
        ),
        _Scheme("fp8"),
    )
    yield (
        WeightFormat(
            id="fp8-block",
            label="FP8 (128x128 blocks)",
            description="DeepSeek-V3 style: fp8 e4m3 weights with an fp32 scale_inv per 128x128 block; "
            "embeddings, lm_head, norms and routers stay 16-bit",
            family="fp8",
            bits=8 + 32 / _FP8_BLOCK**2,
            source=_SRC_FP8_BLOCK,
        ),
        _Scheme("fp8-block"),
    )
    yield (
        WeightFormat(
            id="int8",
            label="INT8 (bitsandbytes LLM.int8)",
            description="every nn.Linear but lm_head in int8 with an fp32 scale per output row (SCB); "
            "embeddings, lm_head, norms and routers stay 16-bit",
            family="bitsandbytes",
            bits=8,
            source=_SRC_BNB + "; LLM.int8(), arXiv 2208.07339",
        ),
        _Scheme("int8", outside_linears=True),
    )
    for qt in ("nf4", "fp4"):
        yield (
            WeightFormat(
                id=qt,
                label=f"{qt.upper()} (bitsandbytes)",
                description=f"every nn.Linear but lm_head in 4-bit {qt.upper()}, two per byte, one fp32 "
                "absmax per 64 weights; embeddings, lm_head, norms and routers stay 16-bit",
                family="bitsandbytes",
                bits=4 + 32 / _BNB_BLOCK,
                source=_SRC_BNB,
            ),
            _Scheme("bnb4", outside_linears=True),
        )
        yield (
            WeightFormat(
                id=f"{qt}-dq",
                label=f"{qt.upper()} + double quant (bitsandbytes)",
                description=f"4-bit {qt.upper()} with the absmax itself quantized to 8 bits per 64 weights "
                "(fp32 second-level absmax per 256 blocks + fp32 offset): QLoRA's double quantization",
                family="bitsandbytes",
                bits=4 + 8 / _BNB_BLOCK + 32 / (_BNB_BLOCK * _BNB_NESTED_BLOCK),
                source=_SRC_BNB,
            ),
            _Scheme("bnb4", double_quant=True, outside_linears=True),
        )
    for bits in (2, 3, 4, 8):
        yield (
            WeightFormat(
                id=f"gptq-{bits}",
                label=f"GPTQ {bits}-bit (g{_GROUP})",
                description=f"decoder linears in {bits}-bit GPTQ, group size {_GROUP}: int32-packed qweight, "
                "fp16 scales and packed zeros per group, int32 g_idx; modules whose shape does not divide "
                "stay 16-bit",
                family="gptq",
                bits=bits + (16 + bits) / _GROUP,
                source=_SRC_GPTQ,
            ),
            _Scheme("gptq", bits=bits),
        )
    yield (
        WeightFormat(
            id="awq-4",
            label=f"AWQ 4-bit (g{_GROUP})",
            description=f"decoder linears in 4-bit AWQ (GEMM layout), group size {_GROUP}: qweight packed "
            "along out-features, fp16 scales, packed zeros; no g_idx",
            family="awq",
            bits=4 + (16 + 4) / _GROUP,
            source=_SRC_AWQ,
        ),
        _Scheme("awq", bits=4),
    )
    yield (
        WeightFormat(
            id="mxfp4",
            label="MXFP4 (OCP MX)",
            description="decoder linears and experts in 4-bit E2M1 with one E8M0 scale per 32 weights; "
            "embeddings, lm_head, norms and routers stay 16-bit",
            family="microscaling",
            bits=4 + 8 / _MX_BLOCK,
            source=_SRC_MX,
        ),
        _Scheme("mxfp4"),
    )
    yield (
        WeightFormat(
            id="mxfp4-moe",
            label="MXFP4 experts (gpt-oss)",
            description="only the routed experts in MXFP4 (gpt-oss checkpoints, vLLM Mxfp4MoEMethod); "
            "attention, dense MLPs, embeddings and lm_head stay 16-bit",
            family="microscaling",
            bits=4 + 8 / _MX_BLOCK,
            source=_SRC_MX + "; vLLM quantization/mxfp4.py Mxfp4Config (linear layers unquantized)",
        ),
        _Scheme("mxfp4", experts_only=True),
    )
    yield (
        WeightFormat(
            id="nvfp4",
            label="NVFP4",
            description="decoder linears and experts in 4-bit E2M1 with an fp8 e4m3 scale per 16 weights and "
            "an fp32 global scale per tensor; embeddings, lm_head, norms and routers stay 16-bit",
            family="microscaling",
            bits=4 + 8 / _NVFP4_BLOCK,
            source=_SRC_NVFP4,
        ),
        _Scheme("nvfp4"),
    )


# ggml (block size, bytes per block) by type name (gguf-py GGML_QUANT_SIZES)
_GGML_BLOCKS = {t.name: bs for t, bs in GGML_QUANT_SIZES.items()}


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

# File types whose low-bit tensors llama-quantize only writes with an importance matrix
# (tensor_requires_imatrix); for the others we assume none was given (the llama-quantize default).
_FTYPES_WITH_IMATRIX = frozenset(
    {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}
)


def _ggml_bpw(type_name: str) -> float:
    block, size = _GGML_BLOCKS[type_name]
    return size * 8 / block


def _ftype_name(ft: LlamaFileType) -> str:
    return "F32" if ft.name == "ALL_F32" else ft.name.removeprefix("MOSTLY_")


def _gguf_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
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


def _build_registry() -> dict[str, tuple[WeightFormat, _Scheme]]:
    reg: dict[str, tuple[WeightFormat, _Scheme]] = {}
    for fmt, scheme in (*_hf_formats(), *_gguf_formats()):
        if fmt.id in reg:
            raise AssertionError(f"duplicate weight format id {fmt.id}")
        reg[fmt.id] = (fmt, scheme)
    return reg


_REGISTRY = _build_registry()
_LOWER_IDS = {k.lower(): k for k in _REGISTRY}


def list_weight_formats() -> list[WeightFormat]:
    """Every weight format, HF-side formats first, then llama.cpp mixes, then single GGUF tensor types."""
    return [fmt for fmt, _ in _REGISTRY.values()]


def _resolve(fmt_id: str) -> tuple[WeightFormat, _Scheme]:
    key = fmt_id.strip() if isinstance(fmt_id, str) else ""
    hit = _REGISTRY.get(key) or _REGISTRY.get(_LOWER_IDS.get(key.lower(), ""))
    if hit is not None:
        return hit
    close = difflib.get_close_matches(key.lower(), list(_LOWER_IDS), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(_LOWER_IDS[c] for c in close)}?" if close else ""
    raise GpumemInputError(
        f"unknown weight format {fmt_id!r}{hint} (`gpumem formats` lists all {len(_REGISTRY)})",
        field="weights",
    )


def get_weight_format(fmt_id: str) -> WeightFormat:
    """The format called ``fmt_id`` (case-insensitive); an unknown id raises :class:`GpumemInputError`."""
    return _resolve(fmt_id)[0]


# ---- GGUF: llama-quantize's per-tensor type choice --------------------------------------------------------

# tensor_get_category (src/llama-quant.cpp)
_OUTPUT, _TOKEN_EMBD, _QKV, _KV_B, _V, _K, _Q, _AO, _UP, _GATE, _DOWN, _OTHER = range(12)
_ATTN_V_LIKE = frozenset({_V, _QKV, _KV_B})


def _category(name: str) -> int:
    if name == "output.weight":
        return _OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return _TOKEN_EMBD
    for needle, cat in (
        ("attn_qkv.weight", _QKV),
        ("attn_kv_b.weight", _KV_B),
        ("attn_v.weight", _V),
        ("attn_k.weight", _K),
        ("attn_q.weight", _Q),
        ("attn_output.weight", _AO),
        ("ffn_up", _UP),
        ("ffn_gate", _GATE),
        ("ffn_down", _DOWN),
    ):
        if needle in name:
            return cat
    return _OTHER


def _allows_quantization(name: str, ndim: int) -> bool:
    """tensor_allows_quantization for the tensors a ModelSpec has (2-D/3-D weights, no norms or routers)."""
    return (
        ndim >= 2
        and name.endswith("weight")
        and "_norm.weight" not in name
        and "ffn_gate_inp.weight" not in name
        and name != "position_embd.weight"
    )


def _stays_f32(name: str, ndim: int) -> bool:
    """convert_hf_to_gguf.py prepare_tensors: tensors always written as F32."""
    return (
        ndim <= 1
        or name.endswith("_norm.weight")
        or not name.endswith(".weight")
        or "ffn_gate_inp.weight" in name
        or name == "position_embd.weight"
    )


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# tensor_type_fallback: a compatible type when the row length does not divide the block size.
_FALLBACK = {
    **dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
    **dict.fromkeys(("Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}

_IQ_LOW_OUTPUT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_IQ_LOW = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_MOE8_ATTN_OUT_Q5K = frozenset(
    {
        "Q2_K",
        "IQ3_XS",
        "IQ3_XXS",
        "Q3_K_S",
        "Q3_K_M",
        "IQ4_NL",
        "Q4_K_S",
        "Q4_K_M",
        "IQ3_S",
        "IQ3_M",
        "IQ4_XS",
    }
)


def _block_size(type_name: str) -> int:
    return _GGML_BLOCKS[type_name][0]


@dataclass(slots=True)
class _QuantState:
    """The model facts and running counters of llama.cpp's quantize_state_impl."""

    ftype: str
    n_expert: int
    n_gqa: int
    is_falcon: bool
    is_70b: bool
    has_imatrix: bool
    tied: bool
    n_layer: int
    n_attention_wv: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0


def _layer_info(qs: _QuantState, counter: int, layer: int | None) -> tuple[int, int]:
    # MoE models read the layer from the tensor name (experts are not consecutive), others count tensors
    if qs.n_expert > 1 and layer is not None:
        return layer, qs.n_layer
    return counter, qs.n_layer


def _mix_type(qs: _QuantState, t: str, cat: int, ne0: int, ne2: int, layer: int | None) -> str:
    """llama_tensor_get_type_impl: the type a llama-quantize mix gives one tensor (``t``: the default)."""
    ft, n_exp, gqa = qs.ftype, qs.n_expert, qs.n_gqa
    if cat == _OUTPUT or (qs.tied and cat == _TOKEN_EMBD):
        if ft == "MXFP4_MOE" or qs.is_falcon or ne0 % _block_size(t):
            return "Q8_0"
        if ft in _IQ_LOW_OUTPUT:
            return "Q5_K"
        return t if t == "Q8_0" else "Q6_K"
    if ft == "MXFP4_MOE":
        return "MXFP4" if ne2 > 1 else "Q8_0"
    if cat == _TOKEN_EMBD:
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if ft in ("TQ1_0", "TQ2_0"):
            return "Q4_K"
        return t
    if ft in _IQ_LOW:
        if cat in _ATTN_V_LIKE:
            t = "Q4_K" if gqa >= 4 or n_exp >= 4 else ("IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K")
            qs.i_attention_wv += 1
        elif n_exp == 8 and cat == _K:
            t = "Q4_K"
        elif cat == _DOWN:
            if qs.i_ffn_down < qs.n_layer // 8:
                t = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
            qs.i_ffn_down += 1
        elif cat == _AO:
            if n_exp == 8:
                t = "Q5_K"
            elif ft in ("IQ1_S", "IQ1_M"):
                t = "IQ2_XXS"
            elif ft in ("IQ2_S", "IQ2_M"):
                t = "IQ3_S"
        return t
    if cat in _ATTN_V_LIKE:
        i, n = qs.i_attention_wv, qs.n_attention_wv
        if ft == "Q2_K":
            t = "Q4_K" if gqa >= 4 else "Q3_K"
        elif ft == "Q2_K_S" and gqa >= 4:
            t = "Q4_K"
        elif ft == "IQ3_XXS":
            t = "Q4_K" if gqa >= 4 else ("IQ3_S" if not qs.has_imatrix else "IQ3_XXS")
        elif (ft in ("IQ3_XS", "IQ3_S") and gqa >= 4) or ft == "IQ3_M":
            t = "Q4_K"
        elif ft == "Q3_K_M":
            t = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L" or (ft in ("IQ4_NL", "IQ4_XS") and gqa >= 4):
            t = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
            t = "Q6_K"
        elif ft == "Q4_K_S" and i < 4:
            t = "Q5_K"
        if qs.is_70b and t in ("Q3_K", "Q4_K"):
            t = "Q5_K"  # 8 heads share attn_v in the 70B: more bits for a small tensor
        if n_exp == 8:
            t = "Q8_0"
        qs.i_attention_wv += 1
        return t
    if cat == _K:
        if n_exp == 8:
            return "Q8_0"
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return t
    if cat == _Q:
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return t
    if cat == _DOWN:
        i, n = _layer_info(qs, qs.i_ffn_down, layer)
        if ft == "Q2_K":
            t = "Q3_K"
        elif ft == "Q2_K_S":
            if i < n // 8:
                t = "Q4_K"
        elif ft == "IQ3_XXS" and not qs.has_imatrix:
            t = "Q4_K" if i < n // 8 else "Q3_K"
        elif ft == "Q3_K_M":
            more = not qs.is_falcon or _use_more_bits(i, n)
            t = "Q5_K" if i < n // 16 else ("Q4_K" if more else "Q3_K")
        elif ft == "IQ3_M" and (i < n // 8 or (n_exp == 8 and _use_more_bits(i, n))):
            t = "Q4_K"
        elif ft == "Q3_K_L":
            t = "Q4_K" if qs.is_falcon else "Q5_K"
        elif ft == "Q4_K_M":
            if qs.is_falcon:
                t = "Q6_K" if i < n // 16 else ("Q5_K" if _use_more_bits(i, n) else "Q4_K")
            elif _use_more_bits(i, n):
                t = "Q6_K"
        elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not qs.has_imatrix:
            t = "Q5_K"
        elif ft == "Q5_K_M" and _use_more_bits(i, n):
            t = "Q6_K"
        elif ft == "Q4_K_S" and not qs.is_falcon and i < n // 8:
            t = "Q5_K"
        elif ft in ("Q4_0", "Q5_0") and qs.has_imatrix and i < n // 8:
            t = "Q4_1" if ft == "Q4_0" else "Q5_1"
        qs.i_ffn_down += 1
        return t
    if cat == _AO:
        if not qs.is_falcon:
            if n_exp == 8:
                if ft in _MOE8_ATTN_OUT_Q5K:
                    t = "Q5_K"
            else:
                t = {
                    "Q2_K": "Q3_K",
                    "IQ3_XXS": "IQ3_S",
                    "Q3_K_M": "Q4_K",
                    "Q3_K_L": "Q5_K",
                    "IQ3_M": "Q4_K",
                }.get(ft, t)
        elif ft == "Q3_K_L":
            t = "Q4_K"
        return t
    if cat in (_GATE, _UP):
        counter = qs.i_ffn_gate if cat == _GATE else qs.i_ffn_up
        i, n = _layer_info(qs, counter, layer)
        if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
            t = "IQ3_XXS"
        if cat == _GATE:
            qs.i_ffn_gate += 1
        else:
            qs.i_ffn_up += 1
        return t
    return t


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of a GGUF file as llama-quantize would write it.

    ``shape`` is row-major (PyTorch order; ggml's ``ne0`` is the last entry), ``ggml_type`` the chosen
    type and ``nbytes`` its exact size. ``note`` says when llama.cpp had to fall back to another type.
    """

    name: str
    shape: tuple[int, ...]
    component: str
    layer: int | None
    ggml_type: str
    nbytes: int
    note: str = ""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


_LAYER_TENSORS = {
    "self_attn.q_proj": MODEL_TENSOR.ATTN_Q,
    "self_attn.k_proj": MODEL_TENSOR.ATTN_K,
    "self_attn.v_proj": MODEL_TENSOR.ATTN_V,
    "self_attn.o_proj": MODEL_TENSOR.ATTN_OUT,
    "self_attn.q_a_proj": MODEL_TENSOR.ATTN_Q_A,
    "self_attn.q_b_proj": MODEL_TENSOR.ATTN_Q_B,
    "self_attn.kv_a_proj_with_mqa": MODEL_TENSOR.ATTN_KV_A_MQA,
    "self_attn.q_a_layernorm": MODEL_TENSOR.ATTN_Q_A_NORM,
    "self_attn.kv_a_layernorm": MODEL_TENSOR.ATTN_KV_A_NORM,
    "self_attn.q_norm": MODEL_TENSOR.ATTN_Q_NORM,
    "self_attn.k_norm": MODEL_TENSOR.ATTN_K_NORM,
    "mlp.gate_proj": MODEL_TENSOR.FFN_GATE,
    "mlp.up_proj": MODEL_TENSOR.FFN_UP,
    "mlp.down_proj": MODEL_TENSOR.FFN_DOWN,
    "mlp.gate": MODEL_TENSOR.FFN_GATE_INP,
    "mlp.shared_experts.gate_proj": MODEL_TENSOR.FFN_GATE_SHEXP,
    "mlp.shared_experts.up_proj": MODEL_TENSOR.FFN_UP_SHEXP,
    "mlp.shared_experts.down_proj": MODEL_TENSOR.FFN_DOWN_SHEXP,
    "mlp.shared_expert_gate": MODEL_TENSOR.FFN_GATE_INP_SHEXP,
    "mlp.experts.down_proj": MODEL_TENSOR.FFN_DOWN_EXP,
}
_LAYER_NORMS = (
    MODEL_TENSOR.ATTN_NORM,
    MODEL_TENSOR.FFN_NORM,
    MODEL_TENSOR.ATTN_POST_NORM,
    MODEL_TENSOR.FFN_POST_NORM,
)
_GLOBAL_TENSORS = {
    "embed_tokens": "token_embd",
    "embed_positions": "position_embd",
    "embedding_norm": "token_embd_norm",
    "norm": "output_norm",
    "lm_head": "output",
}


@dataclass(frozen=True, slots=True)
class _GName:
    name: str
    shape: tuple[int, ...]
    component: str
    layer: int | None


def _split_suffix(name: str) -> tuple[str, str]:
    """('layers.3.self_attn.q_proj', 'weight'); fused expert tensors have no suffix."""
    base, _, last = name.rpartition(".")
    if last in ("weight", "bias"):
        return base, last
    return name, ""


def _gguf_names(spec: ModelSpec, tensors: Iterable[Tensor]) -> Iterator[_GName]:
    """Our tensors under their GGUF names and shapes (gguf-py TENSOR_NAMES, convert_hf_to_gguf.py splits)."""
    fused = spec.traits.fused_qkv and spec.mla is None  # MLA has no k_proj/v_proj
    qkv: dict[tuple[int | None, str], list[int]] = {}
    for t in tensors:
        base, suffix = _split_suffix(t.name)
        if t.layer is None:
            stem = _GLOBAL_TENSORS.get(base, base)
            yield _GName(f"{stem}.{suffix}" if suffix else stem, t.shape, t.component, None)
            continue
        i = t.layer
        rest = base.split(".", 2)[2]
        blk = f"blk.{i}."
        if fused and rest in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            acc = qkv.setdefault((i, suffix), [0, *t.shape[1:]])
            acc[0] += t.shape[0]
            if rest == "self_attn.v_proj":
                name = TENSOR_NAMES[MODEL_TENSOR.ATTN_QKV].format(bid=i)
                yield _GName(f"{name}.{suffix}", tuple(acc), t.component, i)
            continue
        if rest.startswith("norm") and rest[4:].isdigit():
            k = int(rest[4:])
            stem = (
                TENSOR_NAMES[_LAYER_NORMS[k]].format(bid=i) if k < len(_LAYER_NORMS) else f"{blk}norm{k}_norm"
            )
            yield _GName(f"{stem}.{suffix}", t.shape, t.component, i)
            continue
        if rest == "self_attn.kv_b_proj" and spec.mla is not None:
            # split into k_b [heads, kv_lora_rank, qk_nope] and v_b [heads, v_head_dim, kv_lora_rank]
            # (convert_hf_to_gguf.py DeepseekV2Model.modify_tensors, MLA absorption)
            a, m = spec.num_attention_heads, spec.mla
            r = t.shape[1]
            yield _GName(
                TENSOR_NAMES[MODEL_TENSOR.ATTN_K_B].format(bid=i) + ".weight",
                (a, r, m.qk_nope_head_dim),
                t.component,
                i,
            )
            yield _GName(
                TENSOR_NAMES[MODEL_TENSOR.ATTN_V_B].format(bid=i) + ".weight",
                (a, m.v_head_dim, r),
                t.component,
                i,
            )
            continue
        if rest == "mlp.experts.gate_up_proj":
            e, rows, cols = t.shape
            if spec.mlp_gated:
                for key in (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP):
                    yield _GName(
                        TENSOR_NAMES[key].format(bid=i) + ".weight", (e, rows // 2, cols), t.component, i
                    )
            else:
                yield _GName(
                    TENSOR_NAMES[MODEL_TENSOR.FFN_UP_EXP].format(bid=i) + ".weight", t.shape, t.component, i
                )
            continue
        if rest.startswith("mlp.experts.") and rest.endswith("_bias"):
            stem = "ffn_gate_up_exps" if "gate_up" in rest else "ffn_down_exps"
            yield _GName(f"{blk}{stem}.bias", t.shape, t.component, i)
            continue
        key = _LAYER_TENSORS.get(rest)
        stem = TENSOR_NAMES[key].format(bid=i) if key is not None else f"{blk}{rest.replace('.', '_')}"
        yield _GName(f"{stem}.{suffix}" if suffix else f"{stem}.weight", t.shape, t.component, i)


def _gguf_type_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    block, size = _GGML_BLOCKS[type_name]
    ne0 = shape[-1] if shape else 1
    numel = 1
    for d in shape:
        numel *= d
    rows = numel // ne0 if ne0 else 0
    return rows * (ne0 // block) * size


def _fallback(type_name: str, ne0: int) -> tuple[str, str]:
    """tensor_type_fallback: (type, note) for a row of ``ne0`` weights."""
    block = _GGML_BLOCKS[type_name][0]
    if ne0 % block == 0:
        return type_name, ""
    alt = _FALLBACK.get(type_name)
    if alt is None:
        # llama-quantize aborts ("no tensor type fallback is defined"); we keep the tensor in F16 instead
        return "F16", f"{type_name} needs rows divisible by {block}; llama-quantize aborts here"
    if ne0 % _GGML_BLOCKS[alt][0]:
        return "F16", f"rows of {ne0} fit neither {type_name} nor {alt}: F16"
    return alt, f"rows of {ne0} not divisible by {block}: {type_name} -> {alt}"


# One GGUF tensor of a layer template: (name after "blk.N.", shape, component, category, quantizable,
# written as F32 by the converter, element count)
_Template = tuple[str, tuple[int, ...], str, int, bool, bool, int]


@dataclass(frozen=True, slots=True)
class _Layout:
    """A spec's tensors outside the layer stack, and one decoder layer's tensors per kind of layer.

    ``params.text_tensors`` builds every decoder layer alike except that MoE specs mix MoE and dense layers
    (:meth:`ModelSpec.is_moe_layer`), so a copy of the spec with one layer per kind lists each distinct
    layer once; ``layer_kind[i]`` is the kind of layer ``i``. Sizing a kind once and repeating it keeps
    :func:`weight_bytes` fast for deep models.
    """

    outside: tuple[Tensor, ...]
    kinds: tuple[tuple[Tensor, ...], ...]
    layer_kind: tuple[int, ...]
    gguf_outside: tuple[_Template, ...]
    gguf_kinds: tuple[tuple[_Template, ...], ...]


def _layout(spec: ModelSpec) -> _Layout:
    try:
        return _layout_cached(spec)
    except TypeError:  # a spec with an unhashable field
        return _build_layout(spec)


@functools.lru_cache(maxsize=64)
def _layout_cached(spec: ModelSpec) -> _Layout:
    return _build_layout(spec)


def _build_layout(spec: ModelSpec) -> _Layout:
    moe = spec.moe
    n = spec.num_layers
    if moe is None:
        kinds, layer_kind, mini_moe = 1, (0,) * n, None
    elif 0 < spec.num_moe_layers < n:
        kinds = 2
        layer_kind = tuple(1 if spec.is_moe_layer(i) else 0 for i in range(n))
        mini_moe = moe.model_copy(update={"dense_layers": (0,)})
    else:
        kinds, layer_kind = 1, (0,) * n
        mini_moe = moe.model_copy(update={"dense_layers": () if spec.num_moe_layers else (0,)})
    mini = spec.model_copy(update={"num_layers": kinds, "layer_types": (), "moe": mini_moe})
    outside: list[Tensor] = []
    per_kind: list[list[Tensor]] = [[] for _ in range(kinds)]
    for t in text_tensors(mini):
        if t.layer is None:
            outside.append(t)
        else:
            per_kind[t.layer].append(t)
    # the same tensors under their GGUF names, each list sorted by name as llama-quantize visits them
    gguf_outside = tuple(sorted(_template(g.name, g.shape, g.component) for g in _gguf_names(spec, outside)))
    gguf_kinds = tuple(
        tuple(
            sorted(
                _template(g.name.removeprefix(f"blk.{k}."), g.shape, g.component)
                for g in _gguf_names(spec, tensors)
            )
        )
        for k, tensors in enumerate(per_kind)
    )
    return _Layout(tuple(outside), tuple(tuple(k) for k in per_kind), layer_kind, gguf_outside, gguf_kinds)


def _template(name: str, shape: tuple[int, ...], component: str) -> _Template:
    ndim = len(shape)
    numel = 1
    for d in shape:
        numel *= d
    allows, f32 = _allows_quantization(name, ndim), _stays_f32(name, ndim)
    return name, shape, component, _category(name), allows, f32, numel


def _plan_rows(spec: ModelSpec, scheme: _Scheme) -> Iterator[tuple[int | None, _Template, str, int, str]]:
    """(layer, template, ggml type, bytes, fallback note) of every GGUF tensor, in llama.cpp's order.

    llama-quantize visits tensors sorted by layer, then by name (llama_model_loader weights_map with
    weight_name_comparer); the per-layer counters of llama_tensor_get_type_impl follow that order.
    """
    lay = _layout(spec)
    outside, layers = lay.gguf_outside, lay.gguf_kinds
    default, ftype = scheme.ggml_type, scheme.ftype
    source_float = default if default in _GGML_FLOATS else "F16"
    wv_per_kind = [sum(tp[3] in _ATTN_V_LIKE for tp in kind) for kind in layers]
    qs = _QuantState(
        ftype=ftype,
        n_expert=spec.moe.num_experts if spec.moe is not None else 0,
        n_gqa=spec.num_attention_heads // spec.num_kv_heads,
        is_falcon=spec.traits.gguf_arch == "falcon",
        is_70b=spec.traits.gguf_arch == "llama"
        and spec.num_layers == 80
        and spec.num_attention_heads != spec.num_kv_heads,
        has_imatrix=ftype in _FTYPES_WITH_IMATRIX,
        tied=not any(tp[0] == "output.weight" for tp in outside),
        n_layer=spec.num_layers,
        n_attention_wv=sum(wv_per_kind[k] for k in lay.layer_kind),
    )
    sizes: dict[tuple[str, tuple[int, ...]], int] = {}

    def choose(tp: _Template, layer: int | None) -> tuple[int | None, _Template, str, int, str]:
        shape, cat, allows, f32 = tp[1], tp[3], tp[4], tp[5]
        note = ""
        if default == "F32":
            t = "F32"
        elif not allows:
            t = "F32" if f32 else source_float
        elif default in _GGML_FLOATS:
            t = default
        else:
            t = default
            if ftype:
                ne2 = shape[0] if len(shape) == 3 else 1
                t = _mix_type(qs, t, cat, shape[-1], ne2, layer)
            t, note = _fallback(t, shape[-1])
        key = (t, shape)
        nbytes = sizes.get(key)
        if nbytes is None:
            nbytes = sizes[key] = _gguf_type_bytes(t, shape)
        return layer, tp, t, nbytes, note

    for tp in outside:
        yield choose(tp, None)
    for i, k in enumerate(lay.layer_kind):
        for tp in layers[k]:
            yield choose(tp, i)


def gguf_plan(spec: ModelSpec, fmt_id: str) -> tuple[GgufTensor, ...]:
    """Every tensor of ``spec``'s GGUF file in format ``fmt_id``, in llama.cpp's order, with its type."""
    fmt, scheme = _resolve(fmt_id)
    if scheme.kind != "gguf":
        raise GpumemInputError(f"'{fmt.id}' is not a GGUF format", field="weights")
    return tuple(
        GgufTensor(tp[0] if layer is None else f"blk.{layer}.{tp[0]}", tp[1], tp[2], layer, t, nbytes, note)
        for layer, tp, t, nbytes, note in _plan_rows(spec, scheme)
    )


# ---- weight_bytes ---------------------------------------------------------------------------------------


class _Acc:
    """Running totals while the tensors are sized."""

    def __init__(self, num_layers: int) -> None:
        self.by_component = dict.fromkeys(COMPONENTS, 0)
        self.per_layer = [0] * num_layers
        self.by_storage: dict[str, int] = {}
        self.params = 0
        self.q_params = 0
        self.q_bytes = 0
        self.total = 0

    def add(self, component: str, layer: int | None, numel: int, parts: Parts, quantized: bool) -> None:
        total = 0
        for label, nbytes in parts:
            self.by_storage[label] = self.by_storage.get(label, 0) + nbytes
            total += nbytes
        self.by_component[component] += total
        if layer is not None:
            self.per_layer[layer] += total
        self.total += total
        self.params += numel
        if quantized:
            self.q_params += numel
            self.q_bytes += total

    def repeat(self, layer: _Acc, layers: list[int]) -> None:
        """Add ``layer`` (one decoder layer's totals) once for each layer index in ``layers``."""
        n = len(layers)
        for k, v in layer.by_component.items():
            self.by_component[k] += v * n
        for k, v in layer.by_storage.items():
            self.by_storage[k] = self.by_storage.get(k, 0) + v * n
        for i in layers:
            self.per_layer[i] += layer.total
        self.total += layer.total * n
        self.params += layer.params * n
        self.q_params += layer.q_params * n
        self.q_bytes += layer.q_bytes * n


def _kept_label(nbytes: int) -> str:
    return "fp32 (kept)" if nbytes == 4 else "16-bit float (kept)"


def _quantizes(scheme: _Scheme, role: str, quantize_experts: bool) -> bool:
    if role == "experts":
        return quantize_experts
    if scheme.experts_only:
        return False
    return role == "linear" or (role == "linear_io" and scheme.outside_linears)


def _hf_tensors(
    acc: _Acc,
    tensors: Iterable[Tensor],
    spec: ModelSpec,
    fmt: WeightFormat,
    scheme: _Scheme,
    cdt: int,
    qe: bool,
) -> None:
    kept = _kept_label(cdt)
    last_weight, last_quantized = "", False
    for t in tensors:
        numel = t.numel
        if scheme.kind == "float":
            acc.add(t.component, None, numel, ((fmt.id, numel * scheme.float_bytes),), False)
            continue
        role = _role(t)
        if role == "bias":
            owner = t.name.rpartition(".")[0]
            fp16_bias = scheme.kind in ("gptq", "awq") and last_quantized and owner == last_weight
            # GPTQ/AWQ QuantLinear keep the bias as an fp16 buffer; elsewhere it stays in the compute dtype
            parts: Parts = (("fp16 bias", 2 * numel),) if fp16_bias else ((kept, cdt * numel),)
            acc.add(t.component, None, numel, parts, False)
            continue
        quantized = False
        parts = ((kept, cdt * numel),)
        if _quantizes(scheme, role, qe):
            if role == "experts":
                count, out, inp = _expert_matrices(t, spec.mlp_gated)
                one = _matrix_parts(scheme, out, inp)
                if one is not None:
                    parts, quantized = tuple((lab, b * count) for lab, b in one), True
            else:
                one = _matrix_parts(scheme, t.shape[0], t.shape[1])
                if one is not None:
                    parts, quantized = one, True
        last_weight, last_quantized = t.name.rpartition(".")[0], quantized
        acc.add(t.component, None, numel, parts, quantized)


def _hf_bytes(spec: ModelSpec, fmt: WeightFormat, scheme: _Scheme, cdt: int, quantize_experts: bool) -> _Acc:
    lay = _layout(spec)
    acc = _Acc(spec.num_layers)
    _hf_tensors(acc, lay.outside, spec, fmt, scheme, cdt, quantize_experts)
    for k, tensors in enumerate(lay.kinds):
        one = _Acc(0)
        _hf_tensors(one, tensors, spec, fmt, scheme, cdt, quantize_experts)
        acc.repeat(one, [i for i, kind in enumerate(lay.layer_kind) if kind == k])
    return acc


def _gguf_bytes(spec: ModelSpec, scheme: _Scheme) -> tuple[_Acc, tuple[str, ...]]:
    acc = _Acc(spec.num_layers)
    notes: dict[str, int] = {}
    by_component, by_storage, per_layer = acc.by_component, acc.by_storage, acc.per_layer
    for layer, tp, t, nbytes, note in _plan_rows(spec, scheme):
        by_component[tp[2]] += nbytes
        by_storage[t] = by_storage.get(t, 0) + nbytes
        if layer is not None:
            per_layer[layer] += nbytes
        acc.total += nbytes
        acc.params += tp[6]
        if t not in _GGML_FLOATS:
            acc.q_params += tp[6]
            acc.q_bytes += nbytes
        if note:
            notes[note] = notes.get(note, 0) + 1
    return acc, tuple(f"{n} tensor(s): {text}" for text, n in notes.items())


def _explain(fmt: WeightFormat, scheme: _Scheme, cdt: int, vision_bytes: int, quantize_experts: bool) -> str:
    if scheme.kind == "float":
        return f"weights = P x {scheme.float_bytes} B ({fmt.id}), every parameter including the vision tower"
    kept = f"{cdt} B ({'fp32' if cdt == 4 else 'bf16/fp16'})"
    b, g = scheme.bits, scheme.group
    skip = f"modules with out or in not a multiple of 32, or in not a multiple of {g}, stay unquantized"
    base = {
        "fp8": "quantized linears: out x in x 1 B (fp8 e4m3) + 4 B fp32 scale per tensor (per expert)",
        "fp8-block": "quantized linears: out x in x 1 B + 4 B x ceil(out/128) x ceil(in/128) block scales",
        "int8": "quantized linears: out x in x 1 B (int8) + 4 B x out (fp32 SCB row scales)",
        "bnb4": (
            "quantized linears: n/2 B packed 4-bit + per 64 weights "
            + (
                "1 B absmax + 4 B per 256 blocks nested absmax + 1092 B state"
                if scheme.double_quant
                else "4 B fp32 absmax + 64 B quant_map"
            )
            + " per module (n = out x in)"
        ),
        "gptq": f"quantized linears: in x out x {b}/8 B qweight + (in/{g}) x out x 2 B fp16 scales "
        f"+ (in/{g}) x out x {b}/8 B qzeros + in x 4 B g_idx; {skip}",
        "awq": f"quantized linears: in x out/2 B qweight + (in/{g}) x out x 2 B fp16 scales + "
        f"(in/{g}) x out/2 B qzeros; {skip}",
        "mxfp4": "quantized tensors: out x ceil(in/32) blocks x (16 B E2M1 + 1 B E8M0 scale)",
        "nvfp4": "quantized linears: out x in/2 B E2M1 + out x in/16 B fp8 scales + 8 B fp32 global "
        "scales; in not a multiple of 16 stays unquantized",
        "gguf": "every tensor: rows x (ne0 / block) x block bytes of its ggml type, the type chosen per "
        "tensor as llama-quantize does (llama_tensor_get_type); 1-D tensors, routers and biases F32",
    }[scheme.kind]
    if scheme.kind == "gguf":
        return base + (f"; {_VISION_NOTE} ({vision_bytes} B, the mmproj file)" if vision_bytes else "")
    rest = f"; everything else (embeddings, lm_head, norms, routers, biases) at {kept}"
    if not quantize_experts:
        rest += "; routed experts kept unquantized"
    return base + rest + (f"; {_VISION_NOTE}" if vision_bytes else "")


def _compute(spec: ModelSpec, fmt_id: str, cdt: int, quantize_experts: bool) -> WeightBytes:
    fmt, scheme = _REGISTRY[fmt_id]
    notes: tuple[str, ...] = ()
    if scheme.kind == "gguf":
        acc, notes = _gguf_bytes(spec, scheme)
    else:
        acc = _hf_bytes(spec, fmt, scheme, cdt, quantize_experts)
    vision = spec.vision.params if spec.vision is not None else 0
    vb = 0
    if vision:
        vb = scheme.float_bytes if scheme.kind == "float" else cdt
        if scheme.kind == "gguf" and scheme.ggml_type in _GGML_FLOATS:
            vb = 4 if scheme.ggml_type == "F32" else 2
        label = fmt.id if scheme.kind == "float" else f"vision ({_kept_label(vb)})"
        acc.add("vision", None, vision, ((label, vision * vb),), False)
    total = sum(acc.by_component.values())
    quantized_bits = acc.q_bytes * 8 / acc.q_params if acc.q_params else 0.0
    inputs: dict[str, int | float | str | bool | None] = {
        "format": fmt.id,
        "params": acc.params,
        "quantized_params": acc.q_params,
        "kept_params": acc.params - acc.q_params,
        "quantized_bits_per_param": round(quantized_bits, 4),
        "compute_dtype_bytes": cdt,
        "vision_params": vision,
    }
    if scheme.kind in ("gptq", "awq"):
        inputs["group_size"] = scheme.group
        inputs["bits"] = scheme.bits
    if scheme.kind == "gguf":
        inputs["ftype"] = scheme.ftype or f"pure {scheme.ggml_type}"
        for label, nbytes in sorted(acc.by_storage.items(), key=lambda kv: -kv[1]):
            inputs[f"bytes {label}"] = nbytes
    return WeightBytes(
        format=fmt.id,
        total_bytes=total,
        params=acc.params,
        quantized_params=acc.q_params,
        quantized_bytes=acc.q_bytes,
        by_component=acc.by_component,
        per_layer=tuple(acc.per_layer),
        by_storage=dict(sorted(acc.by_storage.items(), key=lambda kv: -kv[1])),
        bits_per_param=total * 8 / acc.params if acc.params else 0.0,
        notes=notes,
        explain=Explanation(
            formula=_explain(fmt, scheme, cdt, vb, quantize_experts),
            inputs=inputs,
            source=fmt.source,
        ),
    )


@functools.lru_cache(maxsize=512)
def _cached(spec: ModelSpec, fmt_id: str, cdt: int, quantize_experts: bool) -> WeightBytes:
    return _compute(spec, fmt_id, cdt, quantize_experts)


def weight_bytes(
    spec: ModelSpec, fmt_id: str, *, compute_dtype_bytes: int = 2, quantize_experts: bool = True
) -> WeightBytes:
    """Exact bytes of ``spec``'s weights stored in format ``fmt_id``.

    ``compute_dtype_bytes`` (2: bf16/fp16, 4: fp32) is the width of every tensor the format leaves
    unquantized. ``quantize_experts=False`` keeps routed experts at the compute dtype, as transformers >= 5
    with bitsandbytes does (fused 3-D expert parameters are not ``nn.Linear``; bitsandbytes issue #1849).
    Results are cached per (spec, format, options).
    """
    fmt, _ = _resolve(fmt_id)
    if compute_dtype_bytes not in (2, 4):
        raise GpumemInputError(
            f"compute dtype must be 2 (bf16/fp16) or 4 (fp32) bytes, got {compute_dtype_bytes}",
            field="compute_dtype",
        )
    try:
        hash(spec)
    except TypeError:  # a spec with an unhashable field: compute without the cache
        return _compute(spec, fmt.id, compute_dtype_bytes, quantize_experts)
    return _cached(spec, fmt.id, compute_dtype_bytes, quantize_experts)


# ---- KV-cache dtypes ------------------------------------------------------------------------------------

# the engines gpumem models (InferenceRun.engine)
ENGINES: tuple[str, ...] = ("transformers", "vllm", "llama.cpp")


class KvDtype(Frozen):
    """A KV-cache element type: bytes per element (block scales included) and the engines that take it."""

    id: str
    label: str
    bytes_per_element: float = Field(gt=0)
    engines: tuple[str, ...]
    source: str


def _ggml_kv(name: str) -> float:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return size / block


_SRC_LLAMACPP_KV = (
    "llama.cpp common/arg.cpp kv_cache_types (-ctk/-ctv: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
    "q5_1); bytes from ggml block sizes (gguf-py GGML_QUANT_SIZES)"
)
_SRC_VLLM_KV = (
    "vLLM vllm/config/cache.py CacheDType (auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2); auto = the model dtype"
)
_SRC_HF_KV = (
    "transformers cache_utils.py: DynamicCache stores K/V in the model dtype; QuantizedCache (quanto: 2/4 "
    "bits, HQQ: up to 8 bits) — element bytes only, its per-group scales/zero-points and the residual_length "
    "tokens kept in full precision are not included"
)

_KV_LIST = (
    KvDtype(id="fp32", label="fp32", bytes_per_element=4, engines=ENGINES, source=_SRC_FLOAT),
    KvDtype(id="fp16", label="fp16", bytes_per_element=2, engines=ENGINES, source=_SRC_FLOAT),
    KvDtype(id="bf16", label="bf16", bytes_per_element=2, engines=ENGINES, source=_SRC_FLOAT),
    KvDtype(id="fp8", label="fp8 (e4m3)", bytes_per_element=1, engines=("vllm",), source=_SRC_VLLM_KV),
    KvDtype(id="fp8_e4m3", label="fp8 e4m3", bytes_per_element=1, engines=("vllm",), source=_SRC_VLLM_KV),
    KvDtype(id="fp8_e5m2", label="fp8 e5m2", bytes_per_element=1, engines=("vllm",), source=_SRC_VLLM_KV),
    KvDtype(
        id="int8",
        label="int8 (quantized cache)",
        bytes_per_element=1,
        engines=("transformers",),
        source=_SRC_HF_KV,
    ),
    KvDtype(
        id="int4",
        label="int4 (quantized cache)",
        bytes_per_element=0.5,
        engines=("transformers",),
        source=_SRC_HF_KV,
    ),
    *(
        KvDtype(
            id=name.lower(),
            label=f"{name} (ggml block of {GGML_QUANT_SIZES[GGMLQuantizationType[name]][0]})",
            bytes_per_element=_ggml_kv(name),
            engines=("llama.cpp",),
            source=_SRC_LLAMACPP_KV,
        )
        for name in ("Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1")
    ),
)

KV_DTYPE_INFO: dict[str, KvDtype] = {k.id: k for k in _KV_LIST}
KV_DTYPES: dict[str, float] = {k.id: k.bytes_per_element for k in _KV_LIST}
"""Bytes per cached element of each KV dtype id (``q8_0``: 34/32, a 32-element block with an fp16 scale)."""

# Spellings engines use on their command lines (llama.cpp f16/f32, vLLM bfloat16/float16).
_KV_ALIASES = {
    "f32": "fp32",
    "f16": "fp16",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "half": "fp16",
}


def _kv_id(kv_dtype: str) -> str:
    key = kv_dtype.strip().lower() if isinstance(kv_dtype, str) else ""
    return _KV_ALIASES.get(key, key)


@functools.cache
def engine_kv_dtypes(engine: str) -> tuple[str, ...]:
    """KV dtype ids ``engine`` accepts (vLLM's ``auto`` is resolved to the compute dtype before sizing);
    fixed per engine, so computed once (every estimate checks its KV dtype against them)."""
    if engine not in ENGINES:
        raise GpumemInputError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}", field="engine")
    return tuple(k.id for k in _KV_LIST if engine in k.engines)


def kv_bytes_per_element(kv_dtype: str) -> float:
    """Bytes one cached K or V element takes in ``kv_dtype`` (block scales included)."""
    kid = _kv_id(kv_dtype)
    if kid in KV_DTYPES:
        return KV_DTYPES[kid]
    if kid == "auto":
        raise GpumemInputError(
            "'auto' means the compute dtype: resolve it before sizing the cache", field="kv_dtype"
        )
    raise GpumemInputError(
        f"unknown KV-cache dtype {kv_dtype!r}; known: {', '.join(KV_DTYPES)}", field="kv_dtype"
    )


def check_kv_dtype(engine: str, kv_dtype: str) -> None:
    """Raise :class:`GpumemInputError` (field ``kv_dtype``) unless ``engine`` can cache in ``kv_dtype``."""
    allowed = engine_kv_dtypes(engine)
    kid = _kv_id(kv_dtype)
    if kid in allowed or (kid == "auto" and engine == "vllm"):
        return
    extra = ", auto" if engine == "vllm" else ""
    raise GpumemInputError(
        f"{engine} cannot store the KV cache as {kv_dtype!r}; allowed: {', '.join(allowed)}{extra}",
        field="kv_dtype",
    )
