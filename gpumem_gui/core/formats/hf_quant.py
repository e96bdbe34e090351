"""Hugging Face-side quantization rules: which tensors a float, FP8, bitsandbytes, GPTQ, AWQ or MX format
quantizes, and how one quantized ``[out, in]`` matrix is stored (packed weights, scales, zero-points,
indices), as the library that writes or loads the format lays it out.

``_hf_formats`` lists these formats for the registry (:mod:`.registry`); the byte accounting
(:mod:`.accounting`) asks ``_quantizes`` whether a tensor is quantized and ``_matrix_parts`` what it costs.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpumem_gui.core.formats.scheme import _GROUP, _SRC_FLOAT, Parts, WeightFormat, _ceil, _Scheme
from gpumem_gui.core.spec.params import Tensor

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
    if len(t.shape) == 3 and t.component == "routed_experts":
        return "experts"
    if len(t.shape) != 2:  # nn.Conv1d weights, bare nn.Parameters (DeltaNet conv1d, A_log): never quantized
        return "param"
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


def _quantizes(scheme: _Scheme, role: str, quantize_experts: bool) -> bool:
    if role == "experts":
        return quantize_experts
    if scheme.experts_only:
        return False
    return role == "linear" or (role == "linear_io" and scheme.outside_linears)


# ---- the HF-side formats, in the order the registry lists them ------------------------------------------


def _float_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
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


def _fp8_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
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


def _bitsandbytes_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
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


def _grouped_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
    """GPTQ and AWQ: integer weights with fp16 scales and packed zero-points per group of in-features."""
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


def _microscaling_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
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


def _hf_formats() -> Iterator[tuple[WeightFormat, _Scheme]]:
    """Every HF-side format: plain floats, FP8, bitsandbytes, GPTQ/AWQ, then microscaling."""
    yield from _float_formats()
    yield from _fp8_formats()
    yield from _bitsandbytes_formats()
    yield from _grouped_formats()
    yield from _microscaling_formats()
