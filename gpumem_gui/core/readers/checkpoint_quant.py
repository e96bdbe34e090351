"""The weight format a checkpoint is published in, read from its ``config.json``'s ``quantization_config``:
the format whose bytes the checkpoint holds on the GPU, so that a model opened from its config alone is sized
as published rather than as a bf16 copy.

* ``quant_method: mxfp4`` (gpt-oss; transformers ``Mxfp4Config``, ``integrations/mxfp4.py``): only the routed
  experts are MXFP4 (``replace_with_mxfp4_linear`` swaps the experts modules for ``Mxfp4GptOssExperts``:
  uint8 blocks of 32 E2M1 values, one E8M0 scale per block), everything else bf16: ``mxfp4-moe``.
  transformers keeps them packed on a GPU of compute capability >= 7.5 with Triton >= 3.4 and the
  ``kernels`` package; without those it dequantizes them to bf16 at load (``Mxfp4HfQuantizer.
  validate_environment`` sets ``dequantize``), which is the ``bf16`` format. vLLM and SGLang always keep them
  packed.
* ``quant_method: fp8`` (``FineGrainedFP8Config``: DeepSeek-V3/R1, MiniMax-M2, Qwen3-FP8): e4m3 weights with
  an fp32 ``weight_scale_inv`` per ``weight_block_size`` block (default ``(128, 128)``): ``fp8-block``; no
  block size (``weight_block_size: null``): one scale per tensor, ``fp8``. transformers dequantizes to bf16
  below compute capability 8.9 (``FineGrainedFP8HfQuantizer.validate_environment``).

* ``gptq`` / ``awq`` (``GPTQConfig`` / ``AwqConfig``, group size default 128): ``gptq-<bits>`` / ``awq-4``
  at group size 128; ``bitsandbytes`` (``BitsAndBytesConfig.to_dict()``): ``int8``, ``nf4`` / ``fp4``
  (``bnb_4bit_quant_type``), with ``-dq`` for ``bnb_4bit_use_double_quant``.

Other block or group sizes and ``expert_dtype: fp4`` are layouts no format here sizes: no format is named for
them (the caller keeps its default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short

# FineGrainedFP8Config.weight_block_size default; the block fp8-block sizes (hf_quant._FP8_BLOCK)
_FP8_BLOCK = (128, 128)
_FIELD = "quantization_config"
_GROUP = 128  # the group size the GPTQ / AWQ formats size (hf_quant._GROUP)


def _block_size(qc: Mapping[str, Any], source: str) -> tuple[int, int] | None:
    field = f"{_FIELD}.weight_block_size"
    if "weight_block_size" not in qc:
        return _FP8_BLOCK
    b = qc["weight_block_size"]
    if b is None:
        return None
    ok = isinstance(b, list | tuple) and len(b) == 2
    if not ok or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in b):
        raise GpumemInputError(f"must be two positive integers, got {short(b)}", source=source, field=field)
    return b[0], b[1]


def _integer_format(method: str, qc: Mapping[str, Any]) -> str | None:
    """GPTQ / AWQ at the group size the formats size (128), bitsandbytes' 8-bit and 4-bit layouts."""
    if method == "bitsandbytes":
        if qc.get("load_in_8bit") or qc.get("_load_in_8bit"):
            return "int8"
        if not (qc.get("load_in_4bit") or qc.get("_load_in_4bit")):
            return None
        kind = qc.get("bnb_4bit_quant_type", "fp4")  # BitsAndBytesConfig default "fp4"
        if kind not in ("nf4", "fp4"):
            return None
        return f"{kind}-dq" if qc.get("bnb_4bit_use_double_quant") else kind
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size", _GROUP))
    if group != _GROUP:
        return None
    if method == "awq":
        return "awq-4" if bits == 4 else None
    return f"gptq-{bits}" if bits in (2, 3, 4, 8) else None


def checkpoint_format(config: Mapping[str, Any] | None, source: str = "config.json") -> str | None:
    """The weight format id the config's ``quantization_config`` describes (see the module docstring), or
    None: no quantization_config, or one of a method or layout no format here sizes."""
    if not isinstance(config, Mapping) or config.get(_FIELD) is None:
        return None
    qc = config[_FIELD]
    if not isinstance(qc, Mapping):
        raise GpumemInputError(f"must be an object, got {short(qc)}", source=source, field=_FIELD)
    method = qc.get("quant_method")
    if method is None:
        return None
    if not isinstance(method, str):
        raise GpumemInputError(
            f"must be a string, got {short(method)}", source=source, field=f"{_FIELD}.quant_method"
        )
    method = method.strip().lower()
    if method == "mxfp4":
        return "mxfp4-moe"
    if method in ("gptq", "awq", "bitsandbytes"):
        return _integer_format(method, qc)
    if method != "fp8" or qc.get("expert_dtype", "fp8") != "fp8":
        return None
    block = _block_size(qc, source)
    if block is None:
        return "fp8"
    return "fp8-block" if block == _FP8_BLOCK else None


def checkpoint_quantization(config: Mapping[str, Any] | None, source: str = "config.json") -> str | None:
    """How the checkpoint is quantized, for people: the format :func:`checkpoint_format` names, else the
    ``quant_method`` itself (a method or layout no format here sizes: compressed-tensors, modelopt, ...); None
    for an unquantized checkpoint (no ``quantization_config``, or one without a ``quant_method``)."""
    fmt = checkpoint_format(config, source)
    if fmt is not None:
        return fmt
    qc = config.get(_FIELD) if isinstance(config, Mapping) else None
    method = qc.get("quant_method") if isinstance(qc, Mapping) else None
    if not isinstance(method, str) or not method.strip():
        return None
    return method.strip().lower()
