"""safetensors quantized layouts (GPTQ, AWQ, bitsandbytes, fp8, MXFP4, ...): detection and exact bytes;
headers read elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.safetensors import (
    DTYPE_BITS,
    inventory_from_safetensor_headers,
    inventory_from_safetensors,
    read_safetensors_header,
)
from tests.safetensors_files import (
    AWQ,
    BNB4,
    BNB8,
    FP8,
    GPTQ,
    IN,
    LLAMA,
    Spec,
    header_json,
    nbytes,
    raw_file,
    write_st,
)


@pytest.mark.parametrize(
    ("tensors", "scheme", "attention_bytes", "attention_elements"),
    [
        # qweight 8*32*4 + qzeros 2*4*4 + scales 2*32*2 + g_idx 64*4
        (GPTQ, "gptq", 1024 + 32 + 128 + 256, 256 + 8 + 64 + 64),
        # qweight 64*4*4 + qzeros 2*4*4 + scales 2*32*2
        (AWQ, "awq", 1024 + 32 + 128, 256 + 8 + 64),
        # weight 1024 + absmax 32 + nested_absmax 4 + nested_quant_map 1024 + quant_map 64 + state 120
        (BNB4, "bitsandbytes-4bit", 1024 + 32 + 4 + 1024 + 64 + 120, 1024 + 32 + 1 + 256 + 16 + 120),
        # weight 2048 + SCB 128 + weight_format 1
        (BNB8, "bitsandbytes-8bit", 2048 + 128 + 1, 2048 + 32 + 1),
        # weight 2048 + scale 4
        (FP8, "fp8", 2048 + 4, 2048 + 1),
    ],
)
def test_quantized_layouts(
    tmp_path: Path, tensors: Spec, scheme: str, attention_bytes: int, attention_elements: int
) -> None:
    inv = inventory_from_safetensors(write_st(tmp_path / "model.safetensors", tensors))
    assert inv.quantization == scheme
    assert inv.bytes_by_component["attention"] == attention_bytes
    assert inv.elements_by_component["attention"] == attention_elements
    assert inv.bytes_by_component["embedding"] == 16 * IN * 2
    assert inv.bytes_by_component["norms"] == IN * 2
    assert inv.bytes_by_component["other"] == 0
    assert inv.total_bytes == attention_bytes + 16 * IN * 2 + IN * 2
    by_dtype: dict[str, int] = {}
    for dtype, shape in tensors.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes(dtype, shape)
    assert inv.bytes_by_dtype == dict(sorted(by_dtype.items()))


def test_config_quant_method_wins(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", GPTQ)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "AWQ"}}))
    assert inventory_from_safetensors(tmp_path).quantization == "awq"
    cfg.write_text(
        json.dumps({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    )
    assert inventory_from_safetensors(tmp_path / "model.safetensors").quantization == "bitsandbytes-8bit"
    cfg.write_text(json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}}))
    assert inventory_from_safetensors(tmp_path).quantization == "compressed-tensors"
    cfg.write_text(json.dumps({"model_type": "llama"}))
    assert inventory_from_safetensors(tmp_path).quantization == "gptq"
    cfg.write_text("{broken")
    with pytest.raises(GpumemInputError, match=r"config\.json"):
        inventory_from_safetensors(tmp_path)


def test_bnb_method_without_flags_uses_tensors(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", BNB4)
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}})
    )
    assert inventory_from_safetensors(tmp_path).quantization == "bitsandbytes-4bit"


def test_more_detections(tmp_path: Path) -> None:
    ct: Spec = {
        "model.layers.0.mlp.down_proj.weight_packed": ("I32", [8, 4]),
        "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [8, 1]),
        "model.layers.0.mlp.down_proj.weight_shape": ("I64", [2]),
    }
    assert (
        inventory_from_safetensors(write_st(tmp_path / "ct.safetensors", ct)).quantization
        == "compressed-tensors"
    )
    mx: Spec = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", [2, 8, 1, 16]),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", [2, 8, 1]),
    }
    inv = inventory_from_safetensors(write_st(tmp_path / "mx.safetensors", mx))
    assert inv.quantization == "mxfp4"
    assert inv.bytes_by_component["routed_experts"] == 256 + 16


def test_sub_byte_dtype(tmp_path: Path) -> None:
    f = tmp_path / "f4.safetensors"
    f.write_bytes(raw_file({"w": {"dtype": "F4", "shape": [4, 6], "data_offsets": [0, 12]}}, 12))
    inv = inventory_from_safetensors(f)
    assert (inv.total_elements, inv.total_bytes) == (24, 12)
    f.write_bytes(raw_file({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}, 1))
    with pytest.raises(GpumemInputError, match="do not fill whole bytes"):
        read_safetensors_header(f)


def test_every_spec_dtype_is_known() -> None:
    # safetensors/src/tensor.rs Dtype (May 2026)
    assert set(DTYPE_BITS) == {
        "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
        "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64",
    }  # fmt: skip


def test_headers_from_elsewhere() -> None:
    h1, _ = header_json({n: LLAMA[n] for n in list(LLAMA)[:5]})
    h2, _ = header_json({n: LLAMA[n] for n in list(LLAMA)[5:]})
    h1["__metadata__"] = {"format": "pt"}
    inv = inventory_from_safetensor_headers(
        {"model-2.safetensors": h2, "model-1.safetensors": h1}, source="hf://org/m", quant_method=None
    )
    assert inv.source == "hf://org/m"
    assert inv.files == ("model-1.safetensors", "model-2.safetensors")
    assert (inv.tensor_count, inv.total_bytes) == (12, 6080)
    q, _ = header_json(GPTQ)
    assert inventory_from_safetensor_headers({"m.safetensors": q}, source="s").quantization == "gptq"
    assert inventory_from_safetensor_headers(
        {"m.safetensors": q}, source="s", quant_method="GPTQ"
    ).quantization == ("gptq")
    with pytest.raises(GpumemInputError, match="unknown dtype"):
        inventory_from_safetensor_headers(
            {"m.safetensors": {"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}}, source="s"
        )
    with pytest.raises(GpumemInputError, match="no safetensors headers"):
        inventory_from_safetensor_headers({}, source="s")
